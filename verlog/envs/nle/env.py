"""MiniHack tasks and the NetHack Challenge (``nle`` + ``minihack``) played in text.

Names: ``minihack:<task>`` for the MiniHack tasks of BALROG's suite that run offline
(:data:`MINIHACK_TASKS`) and ``nethack`` for ``NetHackChallenge-v0``. BALROG also evaluates
``Boxoban-Hard`` and ``Boxoban-Medium``; their levels are downloaded at run time, which cannot
work offline, so they are left out (:data:`MINIHACK_LEFT_OUT`).

What the model reads is :func:`verlog.envs.nle.verlog_text.render`: the turn's messages, status,
position, what lies in each compass direction, what else is on the map with direction and
distance, and the inventory (the ASCII map too with ``show_map=True``).

Actions are named (``north``, ``far east``, ``go down``, ``search``, ``kick west``, ``eat f``,
``zap g north`` ...; :data:`verlog.envs.nle.verlog_text.BASE_ACTIONS`). One action can take several
keystrokes: the command key, then the answers to the prompts it raises, taken from its
arguments (the direction, the item letter). Every other prompt is handled so the agent never
faces a stalled game: ``--More--`` is continued (its text kept in the message), a menu or text
window is closed, a yes/no question or a prompt the action has no answer for is answered with
Escape (which means "no"), and a note in the message says what was answered. After every step the
game is back at its normal command prompt (``prompt_pending()`` is False).

MiniHack: the actions offered are the ones the task allows (``MazeWalk``: the eight compass
moves; ``Corridor-R3``: moves, ``open``, ``kick``, ``search``; the ``Quest`` tasks: everything).
Reward is 1 when the task's goal is reached (the episode ends), else 0; BALROG's progression is
the same win flag. As in BALROG: a random character (``character="@"``, though ``CorridorBattle``
and ``Quest-Medium`` always play a knight), no autopickup, 100 steps.

NetHack: reward is the change of the in-game score; progression is BALROG's milestone value of
the deepest dungeon level and highest experience level reached (``verlog.envs.progression``). As
in BALROG an episode stops after 100,000 steps, or when the game's turn counter has not moved for
150 steps (truncated, ``info["aborted"]``).

An answer that names no valid action runs the default action (``north`` in MiniHack, ``esc`` in
NetHack, as in BALROG) and, in verlog's variant, pays the invalid-action penalty (under BALROG's
protocol it costs nothing, as in BALROG). Seeds fix NetHack's random number
generators (``core`` and ``disp``, no reseeding, moon phase derived from the seed), so a seed
replays the same game given the same actions. ``NetHackChallenge-v0`` forbids changing its seeds
through its API; the seeds are set on the underlying ``nle`` game object instead.

**BALROG's protocol** (:func:`make_minihack` / :func:`make_nethack` with ``protocol="balrog"``;
:class:`BalrogMiniHackTextEnv`, :class:`BalrogNetHackTextEnv`): the game made with BALROG's
settings (``config.yaml``), the text BALROG's model reads (:mod:`verlog.envs.nle.balrog_text`: the
NLE language wrapper's message, language observation and cursor, the full terminal as the map,
the inventory), one key per answer named as the wrapper names it, the game's questions and menus
left to the model (only ``--More--`` is continued), and BALROG's instructions and goals. What is
above about named multi-key actions, answered prompts and the render is verlog's variant only.
"""

from __future__ import annotations

import random
import re
import warnings
from functools import lru_cache
from typing import Any, Iterable, Mapping

import numpy as np
from nle import nethack

from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.balrog_protocol import clean_answer
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.family import check_protocol
from verlog.envs.nle import MINIHACK_LEFT_OUT, MINIHACK_MAX_STEPS, MINIHACK_TASKS, NETHACK_ID, NETHACK_MAX_STEPS
from verlog.envs.nle.verlog_text import (
    BASE_ACTIONS,
    DIRECTIONS,
    SYNONYMS,
    Stats,
    expand_actions,
    inventory_items,
    message_of,
    render,
    resolve,
    screen_lines,
)
from verlog.envs.progression import NetHackProgress, goal_value
from verlog.step_info import step_info

#: the goal of each MiniHack task, as told to the model
MINIHACK_GOALS: Mapping[str, str] = {
    "MazeWalk-9x9": (
        "You are in a 9x9 maze. Find the staircase down (>) and step onto it. You only see "
        "along straight lines of the maze, so explore."
    ),
    "MazeWalk-15x15": (
        "You are in a 15x15 maze. Find the staircase down (>) and step onto it. You only see "
        "along straight lines of the maze, so explore."
    ),
    "Corridor-R3": (
        "Three rooms are joined by corridors. Find the staircase down (>) and step onto it. "
        "Corridors are drawn as you walk them; doors may need opening (or kicking, if locked)."
    ),
    "CorridorBattle-Dark": (
        "A dark room leads through a corridor to another dark room held by giant rats. Reach the "
        "staircase down (>) at the far end, fighting the rats (move into a monster to attack "
        "it). Fighting them one at a time from inside the corridor is safer."
    ),
    "Quest-Easy": (
        "A river of lava separates you from the staircase down (>). Pick up the wand and the horn "
        "on your square, cross the lava (zapping the wand of cold, or applying the frost horn, at "
        "it freezes it), fight the monsters and step onto the staircase."
    ),
    "Quest-Medium": (
        "A corridor leads from your room to a hall held by giant rats, with lava before the "
        "staircase down (>). Pick up the wand and the horn on your square, fight your way through, "
        "freeze the lava (zap the wand of cold or apply the frost horn at it) and step onto the "
        "staircase."
    ),
}

OBSERVATION_KEYS = (
    "glyphs",
    "blstats",
    "message",
    "inv_strs",
    "inv_letters",
    "tty_chars",
    "tty_cursor",
    "screen_descriptions",
)
DEFAULT_MINIHACK_MAX_STEPS = MINIHACK_MAX_STEPS
DEFAULT_NETHACK_MAX_STEPS = NETHACK_MAX_STEPS
DEFAULT_NO_PROGRESS_TIMEOUT = 150  # BALROG: steps without the game's turn counter moving
#: keystrokes the environment sends for one action, at most (a stuck game raises instead)
MAX_KEYS_PER_ACTION = 64
_UNLIMITED = 10**9

_MORE = "\r"
_WINDOW_END = re.compile(r"--More--|\(end\)|\(\d+ of \d+\)")
_ESC = chr(27)


def _unknown_task(task: str) -> ValueError:
    valid = ", ".join(f"minihack:{t}" for t in MINIHACK_TASKS)
    left_out = "; ".join(f"{t}: {why}" for t, why in MINIHACK_LEFT_OUT.items())
    return ValueError(f"unknown MiniHack task {task!r}; valid names: {valid} (left out: {left_out})")


def _verlog_only(protocol: str, use: str) -> None:
    if protocol != "verlog":
        raise ValueError(f"this class plays verlog's protocol only (got protocol={protocol!r}); BALROG's: {use}")


def _import_minihack() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minihack imports the deprecated pkg_resources
        import minihack  # noqa: F401  (registers the MiniHack-* gym ids)


def _make_gym(gym_id: str, **kwargs: Any) -> Any:
    import gymnasium as gym

    if gym_id.startswith("MiniHack"):
        _import_minihack()
    else:
        import nle  # noqa: F401  (registers NetHackChallenge-v0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gym.make(gym_id, **kwargs).unwrapped


@lru_cache(maxsize=None)
def native_keys(gym_id: str) -> frozenset[str]:
    """The keys a MiniHack task's own action space allows (its restricted action set)."""
    env = _make_gym(gym_id, observation_keys=("glyphs", "blstats"))
    try:
        return frozenset(chr(int(a)) for a in env.actions)
    finally:
        env.close()


class _NLEGame(TextEnv):
    """An NLE game behind a text environment: what verlog's variant (:class:`NLETextEnv`) and
    BALROG's (:class:`BalrogNLETextEnv`) share: the gym game, its seeding, and the episode
    bookkeeping a reset starts over. Subclasses render and step the game their own way."""

    #: the action an invalid answer runs (NetHack's; MiniHack's is ``north``)
    default_action = "esc"

    def __init__(
        self,
        gym_id: str,
        seed: int | None,
        *,
        max_steps: int,
        invalid_action_penalty: float,
        gym_kwargs: Mapping[str, Any],
    ) -> None:
        self.gym_id = gym_id
        self.max_steps = max_steps
        self.invalid_action_penalty = invalid_action_penalty
        self.game = _make_gym(gym_id, **gym_kwargs)
        self._rng = random.Random(seed)
        self._seed = seed
        self._obs: Mapping[str, np.ndarray] | None = None
        self._steps = 0
        self._done = True
        self._observation = ""
        self.last_seed: int | None = None

    def _seed_game(self, seed: int) -> None:
        nh = self.game.nethack
        # NetHackChallenge forbids ``seed`` (and shadows set_initial_seeds on the instance);
        # the class method still sets the seeds of the next reset.
        type(nh).set_initial_seeds(nh, seed, seed, False)

    def _begin_episode(self, obs: Mapping[str, np.ndarray]) -> None:
        """Reset per-episode bookkeeping (subclasses add theirs)."""

    def _score_step(
        self, obs: Mapping[str, np.ndarray], reward: float, done: bool, info: dict[str, Any]
    ) -> tuple[float, bool, dict[str, Any]]:
        """Turn the game's outcome into (reward, success, extra info)."""
        return reward, False, {}

    @property
    def observation(self) -> str:
        """The current observation text."""
        return self._observation

    @property
    def raw_observation(self) -> Mapping[str, np.ndarray]:
        """The last ``nle`` observation (arrays)."""
        if self._obs is None:
            raise RuntimeError("call reset() first")
        return self._obs

    def _restart(self, seed: int | None) -> Mapping[str, np.ndarray]:
        """Reset the game for ``seed`` (the pending seed, else a random one) and the episode's
        bookkeeping; the first observation."""
        if seed is None:
            seed = self._seed if self._seed is not None else self._rng.randrange(2**31)
        self._seed = None
        self.last_seed = seed
        self._seed_game(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, _ = self.game.reset()
        self._obs = obs
        self._steps = 0
        self._done = False
        self._begin_episode(obs)
        return obs


class NLETextEnv(_NLEGame):
    """A NetHack-based game in text: the machinery shared by MiniHack and NetHack.

    Subclasses give the gym id, the actions offered, the default action and the goal text, and
    score the steps (``_score_step``).
    """

    def __init__(
        self,
        gym_id: str,
        seed: int | None,
        *,
        max_steps: int,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        show_map: bool = False,
        max_per_name: int = 3,
        gym_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.show_map = show_map
        self.max_per_name = max_per_name
        kwargs = dict(
            observation_keys=OBSERVATION_KEYS,
            allow_all_modes=True,  # --More--, menus and questions reach us: we handle them
            allow_all_yn_questions=True,
            max_episode_steps=_UNLIMITED,  # the step cap is ours, counted in actions
            fix_moon_phase=True,
        )
        kwargs.update(gym_kwargs or {})
        super().__init__(
            gym_id, seed, max_steps=max_steps, invalid_action_penalty=invalid_action_penalty, gym_kwargs=kwargs
        )
        self._key_index = {chr(int(a)): i for i, a in enumerate(self.game.actions)}
        self._message = ""

    # -- subclass hooks ----------------------------------------------------------------------

    def base_actions(self) -> list[str]:
        """The named actions offered (with ``<item>``/``<direction>`` placeholders)."""
        return list(BASE_ACTIONS)

    def _abort_reason(self, obs: Mapping[str, np.ndarray]) -> str | None:
        """A reason to cut the episode now (beyond the step cap), or None."""
        return None

    @property
    def goal(self) -> str:  # pragma: no cover - subclasses override
        return ""

    # -- the game ----------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        obs = self._restart(seed)
        messages: list[str] = []
        notes: list[str] = []
        obs, _, done, _ = self._settle(obs, {}, messages, notes, 0.0)
        self._obs = obs
        self._message = self._join(messages or [message_of(obs)], notes)
        self._observation = self._render()
        return self._observation

    def _render(self) -> str:
        assert self._obs is not None
        if not int(self._obs["blstats"][nethack.NLE_BL_DEPTH]):  # the game is over: no map left
            return f"Message: {self._message or '(none)'}"
        return render(self._obs, self._message, show_map=self.show_map, max_per_name=self.max_per_name)

    @property
    def stats(self) -> Stats:
        return Stats.from_blstats(self.raw_observation["blstats"])

    def prompt_pending(self) -> str | None:
        """What the game waits for besides a command: ``more``, ``menu``, ``yn``, ``getlin``,
        ``extcmd``; ``None`` at the normal command prompt."""
        last = self.game.last_observation
        internal = last[self.game._internal_index]
        if internal[3]:  # xwaitforspace: --More-- or a menu / text window
            screen = "\n".join(screen_lines(self.raw_observation))
            return "more" if "--More--" in screen else "menu"
        if internal[1]:
            return "yn"
        if internal[2]:
            return "getlin"
        cursor = self.raw_observation["tty_cursor"]
        top = screen_lines(self.raw_observation)[0]
        if int(cursor[0]) == 0 and top.startswith("#"):
            return "extcmd"
        return None

    def _press(self, key: str) -> tuple[Mapping[str, np.ndarray], float, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.game.step(self._key_index[key])
        self._obs = obs
        return obs, float(reward), bool(terminated or truncated), info

    def _settle(
        self,
        obs: Mapping[str, np.ndarray],
        answers: dict[str, Any],
        messages: list[str],
        notes: list[str],
        reward: float,
        info: dict[str, Any] | None = None,
    ) -> tuple[Mapping[str, np.ndarray], float, bool, dict[str, Any]]:
        """Answer prompts until the game is back at its command prompt (or over).

        ``answers``: ``direction`` (a key), ``item`` (a letter), ``confirm`` (question substring ->
        key), ``select_all`` (bool), ``text`` (str). Each is used once.
        """
        info = info or {}
        done = False
        for _ in range(MAX_KEYS_PER_ACTION):
            state = self.prompt_pending()
            if state is None:
                break
            text = message_of(obs)
            if state == "more":
                shown = text.replace("--More--", "").strip() or self._window_text(obs)
                if shown:
                    messages.append(shown)
                key = _MORE
            elif state == "menu":
                title = next(iter(self._window_lines(obs)), "")
                if answers.pop("select_all", False):
                    # select every entry, then confirm
                    obs, r, done, info = self._press(".")
                    reward += r
                    if done:
                        break
                    key = _MORE
                else:
                    notes.append(f'(A window was closed: "{title}")' if title else "(A window was closed.)")
                    key = _ESC
            elif state == "yn":
                key = self._answer_question(text, answers, notes)
            elif state == "getlin":
                typed = answers.pop("text", "")
                if typed:
                    for ch in typed:
                        obs, r, done, info = self._press(ch)
                        reward += r
                        if done:
                            break
                    if done:
                        break
                    key = _MORE
                else:
                    notes.append(
                        f'(The game asked "{text}" and it was cancelled.)' if text else "(A text prompt was cancelled.)"
                    )
                    key = _ESC
            else:  # extended command prompt
                key = _ESC
            obs, r, done, info = self._press(key)
            reward += r
            if done:
                break
        else:
            raise RuntimeError(f"the game is stuck at a prompt: {self.prompt_pending()} ({message_of(obs)!r})")
        return obs, reward, done, info

    def _window_lines(self, obs: Mapping[str, np.ndarray]) -> list[str]:
        """The lines of a menu or text window drawn over the map. NetHack's tty draws it from
        some column to the right edge, ending with ``--More--``, ``(end)`` or ``(1 of 2)``."""
        rows = screen_lines(obs)[:23]
        end = next((i for i, r in enumerate(rows) if _WINDOW_END.search(r)), None)
        if end is None:
            return [r.strip() for r in rows if r.strip()][:1]
        marker = rows[end]
        column = len(marker) - len(marker.lstrip())
        lines = [_WINDOW_END.sub("", r[column:]).strip() for r in rows[: end + 1]]
        return [line for line in lines if line]

    def _window_text(self, obs: Mapping[str, np.ndarray]) -> str:
        return re.sub(r"\s+", " ", " ".join(self._window_lines(obs))).strip()

    def _answer_question(self, question: str, answers: dict[str, Any], notes: list[str]) -> str:
        lowered = question.lower()
        if "direction" in lowered:
            if "direction" in answers:
                return str(answers.pop("direction"))
            notes.append(f'(The game asked "{question}" and no direction was given, so it was cancelled.)')
            return _ESC
        if lowered.startswith("what do you want to") or ("[" in lowered and "or ?*" in lowered):
            if "item" in answers:
                return str(answers.pop("item"))
            notes.append(f'(The game asked "{question}" and it was cancelled.)')
            return _ESC
        for fragment, key in answers.get("confirm", ()):
            if fragment in lowered:
                return key
        if "item" in answers and "[" in question:
            # a question listing item letters (e.g. "What do you want to ... [abc or ?*]")
            return str(answers.pop("item"))
        notes.append(f'(The game asked "{question}" and it was answered no.)')
        return _ESC

    @staticmethod
    def _join(messages: list[str], notes: list[str]) -> str:
        seen: list[str] = []
        for m in messages:
            m = m.strip()
            if m and m not in seen:
                seen.append(m)
        return " ".join(seen + notes)

    # -- TextEnv -----------------------------------------------------------------------------

    def valid_actions(self) -> list[str]:
        obs = self._obs
        letters = [letter for letter, _ in inventory_items(obs)] if obs is not None else []
        return expand_actions(self.base_actions(), letters)

    def step(self, action_text: str) -> StepResult:
        if self._done or self._obs is None:
            raise RuntimeError("the episode is over: call reset() first")
        parsed = parse_action(action_text, self.valid_actions(), SYNONYMS)
        executed = parsed.action if parsed.action is not None else self.default_action
        base, args = resolve(executed)
        spec = BASE_ACTIONS[base]
        answers: dict[str, Any] = {"confirm": spec.confirm}
        keys = spec.keys
        if "direction" in args:
            direction_key = DIRECTIONS[args["direction"]][2]
            if "{direction}" in keys:
                keys = keys.replace("{direction}", direction_key)
            else:
                answers["direction"] = direction_key
        if "item" in args or spec.item:
            answers["item"] = args.get("item", spec.item)
        if spec.select_all:
            answers["select_all"] = True
        if spec.text:
            answers["text"] = spec.text

        messages: list[str] = []
        notes: list[str] = []
        reward, done, info = 0.0, False, {}
        for key in keys:
            obs, r, done, info = self._press(key)
            reward += r
            if done:
                break
        if not done:
            obs, reward, done, info = self._settle(obs, answers, messages, notes, reward, info)
        messages.append(message_of(obs))
        self._steps += 1
        score, success, extra = self._score_step(obs, reward, done, info)
        abort = None if done else self._abort_reason(obs)
        terminated = bool(done)
        truncated = not terminated and (self._steps >= self.max_steps or abort is not None)
        if not parsed.valid:  # the agent graph tells the model on its next turn
            score -= self.invalid_action_penalty
        end_status = getattr(info.get("end_status"), "name", str(info.get("end_status", "")))
        if terminated:
            notes.append(
                "(The goal is reached: you won.)"
                if success
                else ("(You died: the game is over.)" if end_status == "DEATH" else "(The game is over.)")
            )
        self._message = self._join(messages, notes)
        self._done = terminated or truncated
        if abort is not None:
            extra["aborted"] = abort
        if self._done:
            extra["end_status"] = end_status
        reported = step_info(executed, parsed.valid, self._steps, done=self._done, success=success, **extra)
        self._observation = self._render()
        return StepResult(self._observation, float(score), terminated, truncated, reported)

    @property
    def instruction(self) -> str:
        helps = "\n".join(f"- {name}: {BASE_ACTIONS[name].help}" for name in self.base_actions())
        has_args = any(BASE_ACTIONS[n].args for n in self.base_actions())
        args = (
            "Write <direction> as one of north, east, south, west, northeast, southeast, "
            "southwest, northwest, and <item> as the letter of an item in your inventory (for "
            "example 'zap f north').\n"
            if has_args
            else ""
        )
        return (
            f"{self.intro}\n"
            f"Goal: {self.goal}\n"
            "The map: north is up; positions are columns (growing east) and rows (growing south). "
            "Each turn you read the game's messages, your status, what lies in each of the eight "
            "directions and what else is on the map with its direction and distance. Moving into "
            "a monster attacks it. You cannot move diagonally into or out of a doorway.\n"
            "The game's questions that your action does not answer are answered 'no' for you, "
            "and you are told so in the message.\n"
            f"You have at most {self.max_steps} actions.\n"
            f"Actions:\n{helps}\n{args}"
            f"{ANSWER_FORMAT}"
        )

    @property
    def intro(self) -> str:
        return "You are playing NetHack, a dungeon crawler, as the @ on the map."

    def close(self) -> None:
        try:
            self.game.close()
        except Exception:  # pragma: no cover - closing twice
            pass


def _seed_minihack(game: Any, seed: int) -> None:
    """Seed the next reset of a MiniHack game (its core and display seeds, no reseeding)."""
    game.seed(seed, seed, reseed=False)


def _minihack_success(done: bool, info: Mapping[str, Any]) -> bool:
    """Whether a MiniHack step ended the episode with the task's goal reached."""
    from minihack import MiniHack

    return bool(done and info.get("end_status") == MiniHack.StepStatus.TASK_SUCCESSFUL)


class MiniHackTextEnv(NLETextEnv):
    """A MiniHack task of BALROG's suite in text (see the module docstring)."""

    default_action = "north"

    def __init__(
        self,
        task: str,
        seed: int | None = None,
        *,
        max_steps: int = DEFAULT_MINIHACK_MAX_STEPS,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        show_map: bool = False,
        character: str = "@",
        autopickup: bool = False,
        max_per_name: int = 3,
        protocol: str = "verlog",
    ) -> None:
        _verlog_only(protocol, "make_minihack(task, seed, protocol='balrog')")
        if task not in MINIHACK_TASKS:
            raise _unknown_task(task)
        self.task = task
        self.name = f"minihack:{task}"
        gym_id = MINIHACK_TASKS[task]
        keys = native_keys(gym_id)
        self._bases = [name for name, spec in BASE_ACTIONS.items() if spec.keys[0] in keys]
        super().__init__(
            gym_id,
            seed,
            max_steps=max_steps,
            invalid_action_penalty=invalid_action_penalty,
            show_map=show_map,
            max_per_name=max_per_name,
            # every key (not only the task's own actions), so any prompt can be answered
            gym_kwargs={"character": character, "autopickup": autopickup, "actions": nethack.ACTIONS},
        )

    def _seed_game(self, seed: int) -> None:
        _seed_minihack(self.game, seed)

    def base_actions(self) -> list[str]:
        return list(self._bases)

    def _score_step(self, obs, reward, done, info):
        success = _minihack_success(done, info)
        return (1.0 if success else 0.0), success, {"progression": goal_value(success)}

    @property
    def intro(self) -> str:
        return (
            f"You are playing MiniHack ({self.task}), a small task in the dungeon crawler NetHack, as the @ on the map."
        )

    @property
    def goal(self) -> str:
        return MINIHACK_GOALS[self.task]


class NetHackTextEnv(NLETextEnv):
    """The NetHack Challenge (``NetHackChallenge-v0``) in text (see the module docstring)."""

    name = "nethack"
    default_action = "esc"

    def __init__(
        self,
        seed: int | None = None,
        *,
        max_steps: int = DEFAULT_NETHACK_MAX_STEPS,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        show_map: bool = False,
        character: str = "@",
        no_progress_timeout: int | None = DEFAULT_NO_PROGRESS_TIMEOUT,
        max_per_name: int = 3,
        protocol: str = "verlog",
    ) -> None:
        _verlog_only(protocol, "make_nethack(seed, protocol='balrog')")
        super().__init__(
            NETHACK_ID,
            seed,
            max_steps=max_steps,
            invalid_action_penalty=invalid_action_penalty,
            show_map=show_map,
            max_per_name=max_per_name,
            gym_kwargs={"character": character, "no_progress_timeout": _UNLIMITED},
        )
        self.no_progress_timeout = no_progress_timeout
        self.progress = NetHackProgress()
        self._last_turn = -1
        self._stalled = 0
        self._last_stats: Stats | None = None

    def _begin_episode(self, obs) -> None:
        self.progress = NetHackProgress()
        stats = Stats.from_blstats(obs["blstats"])
        self.progress.update(stats.depth, stats.experience_level)
        self._last_stats = stats
        self._last_turn = stats.turn
        self._stalled = 0

    def _score_step(self, obs, reward, done, info):
        stats = Stats.from_blstats(obs["blstats"])
        if stats.depth > 0:  # blstats are zero once the game is over: keep the last ones
            self.progress.update(stats.depth, stats.experience_level)
            self._last_stats = stats
        stats = self._last_stats or stats
        extra = {
            "progression": self.progress.value,
            "depth": stats.depth,
            "experience_level": stats.experience_level,
            "max_depth": self.progress.max_depth,
            "max_experience_level": self.progress.max_experience_level,
            "score": stats.score,
            "turn": stats.turn,
        }
        return reward, bool(info.get("is_ascended", False)), extra

    def _abort_reason(self, obs) -> str | None:
        turn = Stats.from_blstats(obs["blstats"]).turn
        if turn == self._last_turn:
            self._stalled += 1
        else:
            self._last_turn, self._stalled = turn, 0
        if self.no_progress_timeout is not None and self._stalled >= self.no_progress_timeout:
            return f"the game's turn counter did not move for {self._stalled} steps"
        return None

    @property
    def goal(self) -> str:
        return (
            "Go as deep into the dungeon as you can and gain experience levels: your score is the "
            "deepest dungeon level and the highest experience level you reach (descend with 'go "
            "down' while standing on a staircase down, >). Stay alive: eat when hungry, pray when "
            "weak or low on hit points (rarely), flee or fight monsters wisely."
        )


# ------------------------------------------------------------------------------------------------
# BALROG's protocol: keystroke actions, the model answers the game's questions, the hybrid text


#: observation keys BALROG's MiniHack environments are made with (``minihack_env.py``)
BALROG_MINIHACK_OBSERVATION_KEYS = (
    "glyphs",
    "blstats",
    "tty_chars",
    "inv_letters",
    "inv_strs",
    "tty_cursor",
    "tty_colors",
)
#: BALROG's ``minihack_kwargs`` (config.yaml), less the ones that only save files
BALROG_MINIHACK_KWARGS: Mapping[str, Any] = {
    "character": "@",
    "max_episode_steps": MINIHACK_MAX_STEPS,
    "penalty_step": -0.01,
    "penalty_time": 0.0,
    "penalty_mode": "constant",
    "autopickup": False,
}
#: BALROG's ``nle_kwargs`` (config.yaml), less the ones that only save files
BALROG_NETHACK_KWARGS: Mapping[str, Any] = {
    "character": "@",
    "max_episode_steps": NETHACK_MAX_STEPS,
    "no_progress_timeout": DEFAULT_NO_PROGRESS_TIMEOUT,
}


class BalrogNLETextEnv(_NLEGame):
    """A NetHack-based game under BALROG's protocol (:func:`make_minihack` / :func:`make_nethack`
    with ``protocol="balrog"``).

    * **Observation**: BALROG's hybrid text (:func:`verlog.envs.nle.balrog_text.balrog_texts`): the
      inventory, then the message, the language observation, the cursor and the full terminal map.
      :attr:`history_observation` (also ``info["history_observation"]``) is the part BALROG keeps
      of it in the history: everything but the inventory.
    * **Actions**: one keystroke per answer, named as the NLE language wrapper names it
      (:meth:`valid_actions`). The answer is stripped and reduced to letters, white space and
      colons; anything that is then not exactly a valid action runs :attr:`default_action`
      (``info["valid_action"]`` is False) and, as in BALROG, costs nothing:
      ``invalid_action_penalty`` is 0 unless given.
    * **Questions and menus reach the model** (``What do you want to eat? [fg or ?*]``): it answers
      with the item's letter, a direction, ``esc``. Only ``--More--`` is continued automatically
      (BALROG's ``skip_more``), its texts joined into the message.
    * **Vision** (``vlm=True``: BALROG's vision protocol, as its ``vlm`` flag of the wrapper): the
      wrapper's *language* view instead (:func:`verlog.envs.nle.balrog_text.balrog_language_texts`:
      no map, the statistics with the inventory), and :meth:`observation_image` the map in tiles.
    """

    def __init__(
        self,
        gym_id: str,
        seed: int | None,
        *,
        max_steps: int,
        invalid_action_penalty: float,
        gym_kwargs: Mapping[str, Any],
        vlm: bool = False,
    ) -> None:
        super().__init__(
            gym_id, seed, max_steps=max_steps, invalid_action_penalty=invalid_action_penalty, gym_kwargs=gym_kwargs
        )
        self.vlm = vlm
        if "max_episode_steps" in gym_kwargs:  # gymnasium's make keeps this one for its TimeLimit
            self.game._max_episode_steps = gym_kwargs["max_episode_steps"]
        self._key_index = {int(a): i for i, a in enumerate(self.game.actions)}
        self._history_observation = ""

    # -- the game ---------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        from verlog.envs.nle.balrog_text import text_message

        obs = self._restart(seed)
        self._render(text_message(obs["tty_chars"]))
        return self._observation

    def _render(self, message: str) -> None:
        from verlog.envs.nle.balrog_text import balrog_language_texts, balrog_texts

        assert self._obs is not None
        texts = balrog_language_texts if self.vlm else balrog_texts
        self._observation, self._history_observation = texts(self._obs, message)

    def observation_image(self) -> Any:
        """The map as BALROG's wrapper draws it (``render("tiles")``): every glyph as its 16x16
        tile of NetHack's tile set (21x79 glyphs: 1264x336 pixels; :mod:`verlog.envs.nle.tiles`)."""
        from verlog.envs.balrog_vision import rgb_image
        from verlog.envs.nle.tiles import render_tiles

        return rgb_image(render_tiles(self.raw_observation["glyphs"]))

    @property
    def history_observation(self) -> str:
        """The current observation as BALROG keeps it in the history (no inventory)."""
        return self._history_observation

    def _press(self, key: int) -> tuple[Mapping[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.game.step(self._key_index[key])
        self._obs = obs
        return obs, float(reward), bool(terminated), bool(truncated), info

    def step(self, action_text: str) -> StepResult:
        from verlog.envs.nle.balrog_text import key_of, text_message

        if self._done or self._obs is None:
            raise RuntimeError("the episode is over: call reset() first")
        cleaned = clean_answer(action_text)  # stripped, then only letters, white space and colons kept
        valid = cleaned in self.valid_actions()
        executed = cleaned if valid else self.default_action
        obs, reward, terminated, truncated, info = self._press(key_of(executed))
        message = text_message(obs["tty_chars"])
        more = key_of("more")
        while "--More--" in message and not (terminated or truncated) and more in self._key_index:
            message = message.replace("--More--", "\n")
            obs, r, terminated, truncated, info = self._press(more)
            reward += r
            message += text_message(obs["tty_chars"])
        self._steps += 1
        score, success, extra = self._score_step(obs, reward, terminated or truncated, info)
        if truncated:  # the game's own limit ended it (NLE also reports it as terminated)
            terminated = False
        truncated = not terminated and (truncated or self._steps >= self.max_steps)
        if not valid:
            score -= self.invalid_action_penalty
        self._done = terminated or truncated
        end_status = getattr(info.get("end_status"), "name", str(info.get("end_status", "")))
        self._render(message)
        extra = {"history_observation": self._history_observation, **extra}
        if end_status == "ABORTED":
            extra["aborted"] = "the game's own limit (steps, or turns without progress)"
        if self._done:
            extra["end_status"] = end_status
        reported = step_info(executed, valid, self._steps, done=self._done, success=success, **extra)
        return StepResult(self._observation, float(score), terminated, truncated, reported)

    def close(self) -> None:
        try:
            self.game.close()
        except Exception:  # pragma: no cover - closing twice
            pass


def _action_lines(names: Iterable[str]) -> str:
    return ",\n".join(f"{name}: {ACTION_HELP.get(name, name)}" for name in names)


#: one line of help per BALROG action name (verlog's words)
ACTION_HELP: Mapping[str, str] = {
    **{
        d: f"step one square {d}"
        for d in ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
    },
    **{
        f"far {d}": f"run {d} until something interesting"
        for d in ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
    },
    "up": "climb the staircase up you stand on",
    "down": "go down the staircase you stand on (only works on stairs down)",
    "wait": "do nothing for one turn",
    "more": "show the rest of a message (only when the message ends with --More--)",
    "annotate": "write a note about the current level",
    "apply": "use a tool",
    "call": "give a name to a monster or an object type",
    "cast": "cast a spell",
    "close": "close a door next to you",
    "open": "open a door next to you",
    "dip": "dip an object into something",
    "drop": "drop an item",
    "droptype": "drop items of chosen kinds (say which next)",
    "eat": "eat something (do so when hungry)",
    "esc": "leave a menu or a question",
    "engrave": "write on the floor (Elbereth scares most monsters)",
    "enhance": "see or improve your weapon skills",
    "fire": "fire what your quiver holds",
    "fight": "attack in a direction, even if you see no monster there",
    "force": "force a lock open",
    "inventory": "show what you carry",
    "invoke": "invoke an object's special power",
    "jump": "jump to another square",
    "kick": "kick a monster, a locked door or a box",
    "look": "look at what is on your square",
    "loot": "open a box on the floor and take things out",
    "monster": "use a special ability of the monster you have become",
    "offer": "sacrifice to the gods (on an altar of your alignment)",
    "overview": "show what you know of the dungeon",
    "pay": "pay a shopkeeper",
    "pickup": "pick up what lies on your square",
    "pray": "ask the gods for help",
    "puton": "put on a ring or an amulet",
    "quaff": "drink something",
    "quiver": "choose what to fire",
    "read": "read a scroll or a spellbook",
    "remove": "remove a ring or an amulet",
    "rub": "rub a lamp or a stone",
    "search": "look for hidden doors and passages around you",
    "swap": "swap your weapon and your second weapon",
    "takeoff": "take off one piece of armour",
    "takeoffall": "take off all your armour",
    "teleport": "teleport (when you can)",
    "throw": "throw something, like a dagger or a dart",
    "travel": "travel to a place on the map (then type < or > for stairs, { for a fountain, _ for an altar)",
    "twoweapon": "fight with two weapons, or stop",
    "untrap": "disarm a trap",
    "wear": "put on a piece of armour",
    "wield": "hold a weapon",
    "wipe": "wipe your face",
    "zap": "zap a wand",
    "minus": "the key -",
    "space": "the space key",
    "apos": "the key '",
    **{str(d): f"the key {d}" for d in range(10)},
}


class BalrogMiniHackTextEnv(BalrogNLETextEnv):
    """A MiniHack task under BALROG's protocol: the task's own action set (the BALROG MiniHack
    actions in it), default action ``north``, 100 steps (MiniHack's own limit), BALROG's goal."""

    default_action = "north"

    def __init__(
        self,
        task: str,
        seed: int | None = None,
        *,
        max_steps: int = DEFAULT_MINIHACK_MAX_STEPS,
        invalid_action_penalty: float = 0.0,
        vlm: bool = False,
    ) -> None:
        from verlog.envs.nle.balrog_text import minihack_action_names

        if task not in MINIHACK_TASKS:
            raise _unknown_task(task)
        self.task = task
        self.name = f"minihack:{task}"
        kwargs = {
            **BALROG_MINIHACK_KWARGS,
            "max_episode_steps": max_steps,
            "observation_keys": BALROG_MINIHACK_OBSERVATION_KEYS,
        }
        super().__init__(
            MINIHACK_TASKS[task],
            seed,
            max_steps=max_steps,
            invalid_action_penalty=invalid_action_penalty,
            gym_kwargs=kwargs,
            vlm=vlm,
        )
        self._actions = minihack_action_names(self.game.actions)

    def _seed_game(self, seed: int) -> None:
        _seed_minihack(self.game, seed)

    def valid_actions(self) -> list[str]:
        return list(self._actions)

    def _score_step(self, obs, reward, done, info):
        success = _minihack_success(done, info)
        # BALROG's progression: 1 when the last step's game reward (MiniHack's 1 for the goal plus
        # its -0.01 penalty for a step on which the turn counter does not move) is at least 1
        return (1.0 if success else 0.0), success, {"progression": goal_value(reward >= 1.0), "game_reward": reward}

    @property
    def goal(self) -> str:
        """BALROG's goal line for the task (its facts, verlog's words)."""
        lowered = self.task.lower()
        if "corridor" in lowered:
            return "Your goal is to explore the level and reach the staircase down."
        if "quest" in lowered:
            return (
                "Your goal is to explore the level, fight the monsters and find your way through "
                "rooms and mazes to the staircase down."
            )
        return "Your goal is to get as far as you can in the game."

    @property
    def instruction(self) -> str:
        return (
            "You are an agent playing MiniHack. These are the actions you can take, each with a "
            f"short description:\n\n{_action_lines(self._actions)}.\n\n"
            "Next you will see the history of actions and observations of the game.\n\n"
            "Tip: repeating the same action is pointless when nothing changes.\n\n"
            f"{self.goal}\n\nPLAY!"
        )


class BalrogNetHackTextEnv(BalrogNLETextEnv):
    """The NetHack Challenge under BALROG's protocol: every useful NetHack command, letters and
    digits as answers to the game's questions, default action ``esc``, 100,000 steps and the
    game's own abort after 150 steps without its turn counter moving; BALROG's progression."""

    name = "nethack"
    default_action = "esc"

    def __init__(
        self,
        seed: int | None = None,
        *,
        max_steps: int = DEFAULT_NETHACK_MAX_STEPS,
        invalid_action_penalty: float = 0.0,
        no_progress_timeout: int = DEFAULT_NO_PROGRESS_TIMEOUT,
        vlm: bool = False,
    ) -> None:
        from verlog.envs.nle.balrog_text import nethack_action_names

        kwargs = {**BALROG_NETHACK_KWARGS, "max_episode_steps": max_steps, "no_progress_timeout": no_progress_timeout}
        super().__init__(
            NETHACK_ID,
            seed,
            max_steps=max_steps,
            invalid_action_penalty=invalid_action_penalty,
            gym_kwargs=kwargs,
            vlm=vlm,
        )
        self._actions = nethack_action_names()
        self.progress = NetHackProgress()
        self._last_stats: Stats | None = None

    def valid_actions(self) -> list[str]:
        return list(self._actions)

    def _begin_episode(self, obs) -> None:
        self.progress = NetHackProgress()
        stats = Stats.from_blstats(obs["blstats"])
        self.progress.update(stats.depth, stats.experience_level)
        self._last_stats = stats

    def _score_step(self, obs, reward, done, info):
        stats = Stats.from_blstats(obs["blstats"])
        if stats.depth > 0:
            self.progress.update(stats.depth, stats.experience_level)
            self._last_stats = stats
        stats = self._last_stats or stats
        extra = {
            "progression": self.progress.value,
            "depth": stats.depth,
            "experience_level": stats.experience_level,
            "max_depth": self.progress.max_depth,
            "max_experience_level": self.progress.max_experience_level,
            "score": stats.score,
            "turn": stats.turn,
        }
        return reward, bool(info.get("is_ascended", False)), extra

    @property
    def instruction(self) -> str:
        from verlog.envs.nle.balrog_text import NETHACK_PROMPT_ACTIONS

        return (
            "You are an agent playing NetHack. These are the actions you can take, each with a "
            f"short description:\n\n{_action_lines(NETHACK_PROMPT_ACTIONS)}.\n\n"
            "Tips:\n"
            '- When the message asks you to complete something, such as "What do you want to eat? '
            '[d or ?*]", answer with the single letter of the item you mean.\n'
            '    - For example, for "What do you want to eat? [dgh or ?*]" the answers are "d", '
            '"g" or "h", to eat that food.\n'
            '- When the message asks "In what direction?", answer with a direction.\n'
            '- When the message ends with --More--, answer "more" to see the rest of it.\n'
            "- Explore to find the staircase down to the next level.\n"
            "- Always read the last message carefully to understand the state of the game before "
            "you choose.\n"
            "- Moving on in one direction ends at a wall, with a message such as \"It's solid "
            'stone" or "It\'s a wall": then move another way to keep exploring.\n'
            "- Read the language observation and look at the ASCII map to decide where to go.\n"
            "- Moving into a monster attacks it.\n\n"
            "Next you will see the history of actions and observations of the game.\n"
            "Your goal is to get as far as you can in the game.\n\nPLAY!"
        )


def make_minihack(task: str, seed: int | None = None, protocol: str = "verlog", **kwargs: Any) -> TextEnv:
    """The MiniHack task ``task`` under ``protocol``: verlog's :class:`MiniHackTextEnv` or
    BALROG's :class:`BalrogMiniHackTextEnv`."""
    if check_protocol(protocol) == "balrog":
        return BalrogMiniHackTextEnv(task, seed, **kwargs)
    return MiniHackTextEnv(task, seed, **kwargs)


def make_nethack(seed: int | None = None, protocol: str = "verlog", **kwargs: Any) -> TextEnv:
    """NetHack under ``protocol``: verlog's :class:`NetHackTextEnv` or BALROG's
    :class:`BalrogNetHackTextEnv`."""
    if check_protocol(protocol) == "balrog":
        return BalrogNetHackTextEnv(seed, **kwargs)
    return NetHackTextEnv(seed, **kwargs)
