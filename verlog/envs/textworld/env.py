"""TextWorld games (the ``textworld`` package) played in text: BALROG's three families.

``textworld:treasure_hunter``
    Find a given object in a house of rooms, through closed and locked doors and containers
    (keys are in the house); picking up the wrong object loses. One point for the right object.
``textworld:coin_collector``
    Find the coin in a chain of rooms. One point.
``textworld:cooking``
    The cooking game: find the cookbook, gather its ingredients from the house, cut and cook
    them as it says, prepare the meal and eat it. A point per required step (17 with the
    settings below); burning or wrongly preparing an ingredient loses.

Games are generated offline from (family, settings, seed) and cached on disk
(:mod:`verlog.envs.textworld.games`). Two protocols:

**verlog** (the training variant, the default). Settings: treasure hunter ``level=26``, coin
collector ``level=220``, cooking ``recipe=5, take=5, go=12, open, cook, cut, split="train"`` with
the recipe drawn from the game seed; every seed is its own game. The model reads the game's text
for each command (banner, goal and status bar removed), then ``Location``, ``Inventory``, the
score and the valid actions (TextWorld's admissible commands, the only commands accepted); the
game's goal text is in the instruction. An answer naming no valid action runs ``look`` and pays
the invalid-action penalty. Why level 26: a level-30 game's generation time has a long tail
(median 6 s, but 2 of 20 seeds took 2 and 7 minutes: TextWorld's backward quest search
backtracks), level 26 takes about 3 s; level 26 keeps the 20-room house with its locks, with a
12-step quest.

**balrog** (``protocol="balrog"``: BALROG's evaluation). The games are made as BALROG's were
(its scripts in ``conglu1997/intelligent-go-explore``, ``textworld/misc/make_*.py``):

* treasure hunter: level 30 (20 rooms, locked doors and containers, a 20-step quest), the goal
  text stating only the last step, and only games whose walkthrough is exactly 20 commands kept;
* coin collector: level 220, the goal text stating only the last step;
* cooking: ``tw-make tw-cooking --recipe 5 --take 5 --go 12 --open --cook --cut --split test``
  (the challenge's default recipe draw, ``recipe_seed=0``);
* a pool of 25 games per family (BALROG ships 25) or, given the user's BALROG
  (``game_files``: :mod:`verlog.envs.balrog_source`), BALROG's own game files, in BALROG's order.
  Episode seed ``s`` plays game ``(s + 1) mod N`` of the ``N`` (``pool_size=None`` gives every seed
  its own generated game). BALROG picks a game with a counter per worker process, incremented
  before use, so a worker's ``k``-th episode of a task plays game ``k mod N`` (``k`` = 1, 2, ...);
  with ``verlog eval``'s seeds (``1,000,000 + i``, a multiple of 25 to start), episode ``i`` plays
  game ``i + 1``, the game BALROG gives the ``i``-th episode when one worker plays them all.
  BALROG's Glulx files (``.ulx``), which TextWorld 1.7 cannot play, are rebuilt once as Z-machine
  files from the ``.json`` game description beside them (the same game; cached).

The model reads only the game's own text: the goal paragraph is removed from every observation
(BALROG splits the text on the goal and keeps what follows it) and nothing is added. Commands are
free text: the answer is cleaned as BALROG's naive agent cleans it (stripped, then only letters,
white space and colons kept) and typed into the game as it is, so every answer is a valid action
and no penalty is ever paid. The instruction gives BALROG's facts for
each game (the commands, its hints, the step budget its prompt states). BALROG ships the cooking
games as Z-machine files (``.z8``), which TextWorld plays as BALROG's TextWorld does: their text
is kept exactly as BALROG's code gives it, the Z-machine's status line (``>  -= Backyard =-0/1``)
included, and the goal is split off exactly as BALROG splits it. Its treasure hunter and coin
collector games are Glulx files (``.ulx``), which print no status line; TextWorld 1.7 plays only
Z-machine files, so these (BALROG's rebuilt, or verlog's generated ones) are ``.z8`` from the same
Inform 7 source with the status line removed. Generated cooking games keep theirs, as BALROG's do.

Both protocols: reward is the score gained by the step; the episode ends (terminated) when the
game is won or lost and is truncated after ``max_steps`` commands (80, BALROG's). Progression is
BALROG's ``max(score / max_score, won)``.

Every call into TextWorld's engine (loading a game, reset, step, close) holds
:data:`verlog.envs.textworld.games.ENGINE_LOCK`: TextWorld parses game files with one
module-level parser, so two games loaded at once in one process corrupt each other. Games are
generated in child processes, never in this one.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.balrog_protocol import clean_answer
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.family import PROTOCOLS, check_protocol
from verlog.envs.progression import textworld_value
from verlog.envs.textworld import BALROG_MAX_STEPS, GAMES
from verlog.envs.textworld.games import (
    ENGINE_LOCK,
    build_game,
    cache_root,
    game_dir,
    zmachine_game,
)
from verlog.step_info import step_info

_COOKING_VERLOG = {
    "recipe": 5,
    "take": 5,
    "go": 12,
    "open": True,
    "cook": True,
    "cut": True,
    "drop": False,
    "split": "train",
}
#: protocol -> family -> default generator settings (see the module docstring)
SETTINGS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    "verlog": {
        "treasure_hunter": {"level": 26},
        "coin_collector": {"level": 220},
        "cooking": _COOKING_VERLOG,
    },
    "balrog": {
        "treasure_hunter": {"level": 30, "only_last_action": True, "walkthrough_length": 20},
        "coin_collector": {"level": 220, "only_last_action": True},
        "cooking": {**_COOKING_VERLOG, "split": "test", "recipe_seed": 0},
    },
}
#: the games (TextWorld challenges) verlog plays, declared with the family
FAMILIES: tuple[str, ...] = GAMES
#: BALROG's number of games per family (episode seed s plays game (s + 1) % 25: see the module docstring)
BALROG_POOL_SIZE = 25
DEFAULT_MAX_STEPS = BALROG_MAX_STEPS
DEFAULT_ACTION = "look"  # verlog's protocol only: under BALROG's every answer is a command
#: the families whose games BALROG ships as Z-machine files (``tw_games/the_cooking_game/*.z8``,
#: whose text shows the status line); treasure hunter's and coin collector's are Glulx (``.ulx``)
BALROG_ZMACHINE_FAMILIES: tuple[str, ...] = ("cooking",)

_DIRECTIONS = ("north", "south", "east", "west")
SYNONYMS: Mapping[str, str] = {
    **{d: f"go {d}" for d in _DIRECTIONS},
    **{f"move {d}": f"go {d}" for d in _DIRECTIONS},
    **{f"walk {d}": f"go {d}" for d in _DIRECTIONS},
    **{f"head {d}": f"go {d}" for d in _DIRECTIONS},
    **{d[0]: f"go {d}" for d in _DIRECTIONS},
    "i": "inventory",
    "inv": "inventory",
    "check inventory": "inventory",
    "l": "look",
    "look around": "look",
}

#: the Z-machine status line TextWorld's games print after each command: ">  -= Room =-0/3"
_STATUS_BAR = re.compile(r"\n\s*>\s*[^\n]*$")
_ROOM = re.compile(r"-=\s*(.+?)\s*=-")
_QUOTES = "'\"\u2018\u2019\u201c\u201d"


def _unknown_family(family: str) -> ValueError:
    valid = ", ".join(f"textworld:{f}" for f in FAMILIES)
    return ValueError(f"unknown TextWorld game {family!r}; valid names: {valid}")


def settings_for(family: str, protocol: str = "verlog", **overrides: Any) -> dict[str, Any]:
    """The generator settings of ``family`` under ``protocol`` with ``overrides`` applied
    (unknown keys rejected)."""
    check_protocol(protocol)
    if family not in FAMILIES:
        raise _unknown_family(family)
    settings = dict(SETTINGS[protocol][family])
    allowed = (
        set(settings) | {"only_last_action", "walkthrough_length"} | ({"recipe_seed"} if family == "cooking" else set())
    )
    for key, value in overrides.items():
        if key not in allowed:
            raise ValueError(f"unknown setting {key!r} for textworld:{family}; valid: {', '.join(sorted(allowed))}")
        settings[key] = value
    return settings


def clean_feedback(text: str, objective: str = "") -> str:
    """The game's text without the banner, the goal paragraph and the trailing status bar
    (verlog's protocol)."""
    text = _STATUS_BAR.sub("", text.rstrip())
    text = text.split("*** The End ***", 1)[0]  # the end-of-game screen (score, RESTART ...)
    after = _after_objective(text, objective)
    if after is not None:
        text = after
    else:
        # the start-of-game banner is ASCII art made of $, \ | _ and spaces
        lines = text.splitlines()
        while lines and (not lines[0].strip() or re.fullmatch(r"[\s$\\|/_<>]+", lines[0])):
            lines.pop(0)
        text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def balrog_feedback(text: str, objective: str, zmachine: bool = False) -> str:
    """The game's text as BALROG's model reads it: what follows the last copy of the goal
    paragraph (the whole text when the goal is not in it), stripped.

    ``zmachine``: the game is one of BALROG's Z-machine files (``.z8``), which BALROG's TextWorld
    plays as verlog does: the text is exactly BALROG's, so it is split on the goal exactly as
    BALROG splits it and keeps the Z-machine's status line (``>  -= Backyard =-0/1``: the room,
    then score/moves). Otherwise it stands for a Glulx game (``.ulx``, rebuilt here as a
    Z-machine one), whose interpreter prints no status line: the line is removed, and the goal
    is found whatever its quotes and spacing (the rebuilt game may print ``That's`` where the
    description says ``That"s``)."""
    if zmachine:
        return text.split(objective)[-1].strip() if objective else text.strip()
    text = _STATUS_BAR.sub("", text.rstrip())
    after = _after_objective(text, objective)
    return (after if after is not None else text).strip()


def _after_objective(text: str, objective: str) -> str | None:
    """The text after the last copy of ``objective`` in ``text``, or ``None`` without one.

    Matching ignores the kind of quote and of white space: the game prints the goal with
    ``That's it!`` where TextWorld's ``objective`` may say ``That"s it!``.
    """
    objective = objective.strip()
    if not objective:
        return None
    if objective in text:
        return text.split(objective)[-1]
    pattern = ""
    for char in objective:
        if char in _QUOTES:
            pattern += f"[{_QUOTES}]"
        elif char.isspace():
            if not pattern.endswith(r"\s+"):
                pattern += r"\s+"
        else:
            pattern += re.escape(char)
    matches = list(re.finditer(pattern, text))
    return text[matches[-1].end() :] if matches else None


def balrog_command(answer: str) -> str:
    """The command BALROG's naive agent types for an answer: the answer stripped, then only its
    letters, white space and colons kept ("take non-euclidean key!" -> "take noneuclidean key")."""
    return clean_answer(answer)


@dataclass
class _Shadow:
    """A second copy of the game, asked for the admissible commands, replaying the episode's
    commands (``replayed`` of them so far; ``None``: the episode restarted)."""

    path: Path
    env: Any
    replayed: int | None = None
    state: Any = None


class TextWorldTextEnv(TextEnv):
    """One TextWorld family as a seeded text game (see the module docstring).

    ``seed`` picks the game of the first ``reset()`` given no seed; later unseeded resets play
    the following seeds (``seed + 1``, ``seed + 2`` ...).
    """

    def __init__(
        self,
        family: str,
        seed: int | None = None,
        *,
        protocol: str = "verlog",
        max_steps: int = DEFAULT_MAX_STEPS,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        cache_dir: str | os.PathLike | None = None,
        pool_size: int | None | str = "default",
        game_files: Sequence[str | os.PathLike] | None = None,
        **settings: Any,
    ) -> None:
        self.protocol = check_protocol(protocol)
        self.family = family
        self.settings = settings_for(family, protocol, **settings)
        self.name = f"textworld:{family}"
        self.max_steps = max_steps
        self.invalid_action_penalty = invalid_action_penalty
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        #: BALROG's own game files (from the user's BALROG), played instead of generated games
        self.game_files: tuple[Path, ...] = tuple(Path(f) for f in game_files or ())
        if self.game_files:
            if protocol != "balrog":
                raise ValueError("game_files are BALROG's games: give them with protocol='balrog'")
            if pool_size not in ("default", len(self.game_files)):
                raise ValueError(f"pool_size is the number of game_files ({len(self.game_files)}): leave it unset")
            missing = [str(f) for f in self.game_files if not f.is_file()]
            if missing:
                raise ValueError(f"TextWorld game files not found: {', '.join(missing[:3])}")
            pool_size = len(self.game_files)
        if pool_size == "default":
            pool_size = BALROG_POOL_SIZE if protocol == "balrog" else None
        if pool_size is not None and (not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"pool_size must be a positive integer or None (got {pool_size!r})")
        self.pool_size: int | None = pool_size
        self._next_seed = seed if seed is not None else 0
        self._game_env: Any = None
        self._game_path: Path | None = None
        #: the commands played this episode, and the shadow game answering valid_actions() under
        #: BALROG's protocol
        self._commands: list[str] = []
        self._shadow: _Shadow | None = None
        self._state: Any = None
        self._steps = 0
        self._done = True
        self._score = 0.0
        self._observation = ""
        self.game_seed: int | None = None
        self.game_file: Path | None = None
        self.seed: int | None = None

    @property
    def balrog(self) -> bool:
        return self.protocol == "balrog"

    # -- game files ------------------------------------------------------------------------------

    def _start(self, path: Path) -> None:
        import textworld

        if self._game_path == path and self._game_env is not None:
            return
        self.close()
        with ENGINE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._game_env = textworld.start(str(path), request_infos=self._infos(not self.balrog))
        self._game_path = path

    def _infos(self, admissible: bool) -> Any:
        """What TextWorld is asked to report. Asking for the admissible commands makes the game
        trace its actions, and cutting the traces out leaves line breaks in the text: the game
        BALROG's model reads is asked only what BALROG asks (goal, room description, score,
        maximum, won; lost, moves and the walkthrough change nothing), so its text is BALROG's to
        the character; the admissible commands come from a shadow copy (:meth:`valid_actions`)."""
        import textworld

        return textworld.EnvInfos(
            admissible_commands=admissible,
            won=True,
            lost=True,
            score=True,
            max_score=True,
            objective=True,
            description=True,
            inventory=not self.balrog,
            moves=True,
            extras=["walkthrough"],
        )

    def game_index(self, seed: int) -> int:
        """The game an episode seed plays: ``(seed + 1) % pool_size`` with a pool (see the module
        docstring: BALROG's counter), else the seed's own."""
        return (seed + 1) % self.pool_size if self.pool_size is not None else seed

    # -- views --------------------------------------------------------------------------------------

    @property
    def objective(self) -> str:
        return str(self._state["objective"]).strip() if self._state is not None else ""

    @property
    def max_score(self) -> float:
        return float(self._state["max_score"]) if self._state is not None else 0.0

    @property
    def walkthrough(self) -> list[str]:
        """The game's own walkthrough (the commands that win it from the start)."""
        if self._state is None:
            return []
        return list(self._state.get("extra.walkthrough") or [])

    @property
    def location(self) -> str:
        if self._state is None:
            return ""
        m = _ROOM.search(str(self._state["description"] or ""))
        return m.group(1) if m else ""

    def _render(self, feedback: str) -> str:
        if self.balrog:
            return feedback
        state = self._state
        inventory = re.sub(r"\s+", " ", str(state["inventory"] or "").strip())
        parts = [feedback or "(nothing happens)"]
        if self.location:
            parts.append(f"Location: {self.location}.")
        parts.append(f"Inventory: {inventory or 'You are carrying nothing.'}")
        parts.append(f"Score: {int(self._score)} of {int(self.max_score)}. Moves: {self._steps} of {self.max_steps}.")
        parts.append(f"Valid actions: {', '.join(self.valid_actions())}")
        return "\n".join(parts)

    @property
    def history_observation(self) -> str:
        """The current observation as BALROG keeps it in the history (all of it: TextWorld has no
        part shown only on the newest turn)."""
        return self._observation

    @property
    def zmachine_text(self) -> bool:
        """Whether BALROG's model reads this game's Z-machine text as it is (status line kept):
        BALROG's game file is a ``.z8`` (not a Glulx file rebuilt here), or, without BALROG's
        files, the family's BALROG games are Z-machine files (:data:`BALROG_ZMACHINE_FAMILIES`)."""
        if self.game_file is not None:
            return self.game_file.suffix != ".ulx"
        return self.family in BALROG_ZMACHINE_FAMILIES

    def _feedback(self, text: str) -> str:
        if self.balrog:
            return balrog_feedback(text, self.objective, zmachine=self.zmachine_text)
        return clean_feedback(text, self.objective)

    # -- TextEnv ------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        if seed is None:
            seed = self._next_seed
        self._next_seed = seed + 1
        if self.game_files:
            game_file = self.game_files[self.game_index(seed)]
            path, used = zmachine_game(game_file, self.cache_dir), None
            self.game_file = game_file
        else:
            path, used = build_game(self.family, self.settings, self.game_index(seed), self.cache_dir)
            self.game_file = None
        self._start(path)
        with ENGINE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._state = self._game_env.reset()
        self._commands = []
        if self._shadow is not None:
            self._shadow.replayed = None  # the shadow starts this episode over when next asked
        self.seed, self.game_seed = seed, used
        self._steps = 0
        self._score = float(self._state["score"] or 0)
        self._done = False
        self._observation = self._render(self._feedback(self._state.feedback))
        return self._observation

    def step(self, action_text: str) -> StepResult:
        if self._done or self._state is None:
            raise RuntimeError("the episode is over: call reset() first")
        if self.balrog:
            command, valid = balrog_command(action_text), True
        else:
            parsed = parse_action(action_text, self.valid_actions(), SYNONYMS)
            command, valid = (parsed.action if parsed.action is not None else DEFAULT_ACTION), parsed.valid
        with ENGINE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._state, _, game_done = self._game_env.step(command)
        self._commands.append(command)
        self._steps += 1
        score = float(self._state["score"] or 0)
        reward = score - self._score
        self._score = score
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        terminated = won or lost or bool(game_done)
        truncated = not terminated and self._steps >= self.max_steps
        if not valid:
            reward -= self.invalid_action_penalty
        self._done = terminated or truncated
        extra: dict[str, Any] = {"game_file": self.game_file.name} if self.game_file is not None else {}
        info = step_info(
            command,
            valid,
            self._steps,
            done=self._done,
            success=won,
            score=score,
            max_score=self.max_score,
            won=won,
            lost=lost,
            progression=textworld_value(score, self.max_score, won),
            game_seed=self.game_seed,
            **extra,
        )
        feedback = self._feedback(self._state.feedback)
        if not self.balrog:
            feedback = feedback.split("*** The End ***", 1)[0].strip()
            if won:
                feedback += "\n(You won the game.)"
            elif lost:
                feedback += "\n(You lost the game.)"
        self._observation = self._render(feedback)
        return StepResult(self._observation, reward, terminated, truncated, info)

    def valid_actions(self) -> list[str]:
        """TextWorld's admissible commands now (under BALROG's protocol any text is accepted:
        these are the commands the game would understand, never shown to the model, read from a
        shadow copy of the game that replays the episode's commands, so that the text the model
        reads stays BALROG's: see :meth:`_infos`)."""
        if self._state is None:
            return []
        if not self.balrog:
            return list(self._state["admissible_commands"] or [])
        import textworld

        with ENGINE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shadow = self._shadow
            if shadow is not None and shadow.path != self._game_path:
                shadow.env.close()
                shadow = None
            if shadow is None:
                env = textworld.start(str(self._game_path), request_infos=self._infos(True))
                shadow = self._shadow = _Shadow(self._game_path, env)
            if shadow.replayed is None:  # a new episode
                shadow.replayed, shadow.state = 0, shadow.env.reset()
            for command in self._commands[shadow.replayed :]:
                shadow.state, _, _ = shadow.env.step(command)
            shadow.replayed = len(self._commands)
            return list(shadow.state["admissible_commands"] or [])

    @property
    def instruction(self) -> str:
        if self.balrog:
            return balrog_instruction(self.family)
        what = {
            "treasure_hunter": "find the object the goal names and pick it up (picking up the wrong one loses the game)",
            "coin_collector": "find the coin and pick it up",
            "cooking": (
                "read the cookbook, gather the ingredients, prepare them as the recipe says (cut "
                "with a knife, cook on the stove, in the oven or on the BBQ), prepare the meal and "
                "eat it; burning or wrongly preparing an ingredient loses the game"
            ),
        }[self.family]
        return (
            "You are playing a text adventure game (TextWorld). You move between rooms and use "
            "objects by typing commands; each turn you read what happened, where you are, what "
            "you carry, your score and the valid actions, which are the only commands accepted.\n"
            f"In this game you {what}.\n"
            f"Goal (from the game): {self.objective or '(not given)'}\n"
            f"You have at most {self.max_steps} commands. Points come from steps of the goal.\n"
            f"{ANSWER_FORMAT}"
        )

    def close(self) -> None:
        if self._game_env is not None:
            try:
                with ENGINE_LOCK:
                    self._game_env.close()
            except Exception:  # pragma: no cover
                pass
        self._game_env = None
        self._game_path = None
        if self._shadow is not None:
            with contextlib.suppress(Exception), ENGINE_LOCK:
                self._shadow.env.close()
            self._shadow = None


# -- BALROG's instructions ------------------------------------------------------------------------
# The facts of BALROG's per-game prompts (balrog/environments/textworld/__init__.py), in verlog's
# words: the game, its commands, its hints and the step budget the prompt states (BALROG's
# prompts say 40 steps for treasure hunter and 25 for coin collector although the cap is 80 for
# every game; we keep the numbers its model reads).

_BALROG_COMMANDS_TREASURE = (
    "look (describe the room you are in), goal (print the goal of the game), inventory (list "
    "what you carry), go <dir> (move north, east, south or west; only where the room shows an "
    "exit or a door), open ... (open a door or a container; a closed door must be opened before "
    "you can go through it), drop ... (put an object down on the floor), take ... (pick up an "
    "object you can see), put ... on ... (place an object on a supporter), take ... from ... "
    "(take an object out of a container or off a supporter), insert ... into ... (place an "
    "object into a container), unlock ... with ... (unlock a door or a container with a key you "
    "carry; a locked door must be unlocked before it can be opened)"
)
_BALROG_COMMANDS_COOKING = (
    "look (describe the room you are in), goal (print the goal of the game), inventory (list "
    "what you carry), go <dir> (move north, east, south or west; only where the room shows an "
    "exit or a door), examine ... (look closely at something), eat ... (eat something edible), "
    "open ... (open a door or a container; a closed door must be opened before you can go "
    "through it), drop ... (put an object down on the floor), take ... (pick up an object you "
    "can see), put ... on ... (place an object on a supporter), take ... from ... (take an "
    "object out of a container or off a supporter), insert ... into ... (place an object into a "
    "container), lock ... with ... and unlock ... with ... (lock or unlock a door or a container "
    "with a key), cook ... with ... (cook food with something that gives heat), slice ... with "
    "..., chop ... with ... and dice ... with ... (cut food with something sharp), prepare meal "
    "(combine the ingredients you carry into a meal; only in the kitchen)"
)


def balrog_instruction(family: str) -> str:
    """The instruction of ``family`` under BALROG's protocol (BALROG's facts, verlog's words)."""
    if family == "treasure_hunter":
        return (
            "You are an agent in TextWorld, a text adventure. You are in a randomly generated "
            "maze of rooms and must find one particular object, exploring the rooms to find it.\n"
            f"Commands: {_BALROG_COMMANDS_TREASURE}.\n"
            "Hints: the object may be inside a closed or locked container. A key fits the lock "
            "whose adjective it shares (a non-euclidean keycard opens the non-euclidean safe): "
            "check the match before unlocking. The key for a door may lie in another room or be "
            "locked in a container. Take every key you can. Something you unlock stays closed "
            "until you open it.\n"
            "You have 40 steps to complete the task. You cannot restart."
        )
    if family == "cooking":
        return (
            "You are an agent in TextWorld, a text adventure: you move through rooms, use objects "
            "and solve puzzles. First find the recipe, then find and prepare the food as the "
            "recipe says, and finally prepare the meal and eat it.\n"
            f"Commands: {_BALROG_COMMANDS_COOKING}.\n"
            "Hints: examine the cookbook to read the recipe once you see it. The BBQ grills, the "
            "stove fries and the oven roasts; cooking an ingredient the wrong way loses the game. "
            "To cook (grill, fry or roast) something it must be in your inventory and a suitable "
            "cooking appliance must be in the room: then use 'cook ... with ...'. To slice, chop "
            "or dice, carry both the knife and the ingredient and use 'slice/chop/dice ... with "
            "knife'. Cut the food before cooking it. With every ingredient processed as the "
            "recipe says, 'prepare meal' in the kitchen, then 'eat meal' to win. Ingredients "
            "must match the recipe's colour exactly when it gives one (any colour otherwise); "
            "write objects with the exact names you see. A container or supporter described as "
            "having nothing on it needs no examining.\n"
            "You have 80 steps to complete the task. You cannot restart."
        )
    if family == "coin_collector":
        return (
            "You are an agent in TextWorld, a text adventure. You are in a randomly generated "
            "maze of rooms and must find the coin, exploring the rooms to find it.\n"
            "Commands: goal (print the goal of the game), go <dir> (move north, east, south or "
            "west; only where the room shows an exit or a door), take coin (win the game when "
            "you see the coin in the room). Going in a direction to explore and 'take coin' once "
            "you see the coin are the only actions you need.\n"
            "You have 25 steps to complete the task. You cannot restart."
        )
    raise _unknown_family(family)


#: how TextWorld's parser answers a command whose words fit more than one thing in sight
AMBIGUOUS = "Which do you mean"


class TextWorldWalkthroughAgent:
    """Plays the game's own walkthrough, one command per turn.

    TextWorld's walkthroughs sometimes repeat a step that is already done (``open fridge`` when
    the fridge stands open): a command the game does not list among its admissible commands now
    is such a no-op, so the agent skips it. It reads the admissible commands from the game (the
    model never sees them under BALROG's protocol).

    Its plan is the walkthrough without the steps that change nothing: ``inventory``, and
    adjacent pairs that undo each other (``drop knife`` then ``take knife``; ``go north`` then
    ``go south``). Cooking walkthroughs fetch and cook one ingredient per trip and can run past
    BALROG's 80 commands without these cuts (96 commands in cooking game 47).

    Under BALROG's protocol an answer loses every character but letters and spaces, so a command
    naming a ``frosted-glass door`` cannot be typed: the agent leaves such words out (``open
    door``), which TextWorld's parser resolves when only one such thing is in sight. So that the
    keys it carries stay apart (``key`` and ``non-euclidean key`` both type as ``key``), it drops
    each key after the last command that uses it (:func:`keys_dropped_after_use`). When the
    parser finds a ``take X from Y`` ambiguous (``Y`` is a ``chest`` beside a ``Canadian chest``),
    it types ``take X``. A game that shows two things whose names differ only by such a word at
    once (a ``portal`` beside a ``non-euclidean portal``) cannot be won under that cleaning by any
    player: the parser asks which one is meant, and only the untypeable word tells them apart.
    """

    def __init__(self, env: TextWorldTextEnv) -> None:
        self.env = env
        self._plan: list[str] = []
        self._retry: str | None = None

    def reset(self) -> None:
        plan = shortened_walkthrough(self.env.walkthrough)
        self._plan = keys_dropped_after_use(plan) if self.env.balrog else plan
        self._retry = None

    def act(self, observation: str) -> str:
        retry, self._retry = self._retry, None
        if retry is not None and AMBIGUOUS in observation:
            # "take latchkey from chest" beside a "Canadian chest": the walkthrough's own words
            # are ambiguous to the parser; "take latchkey" takes it from the open container
            return self._typed(retry)
        valid = set(self.env.valid_actions())
        while len(self._plan) > 1 and valid and self._plan[0] not in valid:
            self._plan.pop(0)
        command = self._plan.pop(0) if self._plan else "look"
        if command.startswith("take ") and " from " in command:
            self._retry = command.split(" from ", 1)[0]
        return self._typed(command)

    def _typed(self, command: str) -> str:
        if not self.env.balrog:
            return f"ACTION: {command}"
        if balrog_command(command) != command:
            command = " ".join(word for word in command.split() if balrog_command(word) == word)
        return command


_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_PREPOSITIONS = re.compile(r" (?:from|with|into|in|on) ")


def _objects(command: str) -> list[str]:
    """The things a command names (``unlock box with latchkey`` -> ``box``, ``latchkey``)."""
    return _PREPOSITIONS.split(command.split(" ", 1)[1]) if " " in command else []


def keys_dropped_after_use(plan: list[str]) -> list[str]:
    """``plan`` with ``drop K`` after the last command that unlocks something with key ``K``."""
    out: list[str] = []
    for i, command in enumerate(plan):
        out.append(command)
        if command.startswith("unlock ") and " with " in command:
            key = command.rsplit(" with ", 1)[1]
            if not any(key in _objects(later) for later in plan[i + 1 :]):
                out.append(f"drop {key}")
    return out


def _undoes(first: str, second: str) -> bool:
    a, b = first.split(), second.split()
    if a[:1] == ["drop"] and b[:1] == ["take"] and a[1:] == b[1:]:
        return True
    return len(a) == len(b) == 2 and a[0] == b[0] == "go" and _OPPOSITE.get(a[1]) == b[1]


def shortened_walkthrough(walkthrough: list[str]) -> list[str]:
    """``walkthrough`` without ``inventory`` and without adjacent command pairs that undo each
    other (``drop X`` / ``take X``, ``go north`` / ``go south``)."""
    plan: list[str] = []
    for command in walkthrough:
        if command == "inventory":
            continue
        if plan and _undoes(plan[-1], command):
            plan.pop()
            continue
        plan.append(command)
    return plan


def pregenerate(
    family: str,
    protocol: str = "balrog",
    games: int | None = None,
    jobs: int = 1,
    cache_dir: str | os.PathLike | None = None,
    **settings: Any,
) -> list[tuple[Path, int]]:
    """Build (or find in the cache) the games a protocol plays, ``jobs`` child processes at a time:
    BALROG's pool of 25 games by default. Returns each game's path and generation seed."""
    from concurrent.futures import ThreadPoolExecutor

    resolved = settings_for(family, protocol, **settings)
    count = games if games is not None else (BALROG_POOL_SIZE if protocol == "balrog" else 10)
    root = Path(cache_dir) if cache_dir is not None else None
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda index: build_game(family, resolved, index, root), range(count)))


def main(argv: list[str] | None = None) -> None:
    """``python -m verlog.envs.textworld.env FAMILY [--protocol balrog] [--games N] [--jobs J]``:
    generate a protocol's games ahead of time (BALROG's level-30 treasure hunter games take 7 s
    median, up to a few minutes)."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("--protocol", default="balrog", choices=PROTOCOLS)
    parser.add_argument("--games", type=int, default=None, help="games 0..N-1 (default: BALROG's 25 / 10)")
    parser.add_argument("--jobs", type=int, default=1, help="child processes building games at once")
    args = parser.parse_args(argv)
    start = time.time()
    built = pregenerate(args.family, args.protocol, args.games, args.jobs)
    for index, (path, used) in enumerate(built):
        print(f"game {index}: seed {used} {path}")
    print(f"{len(built)} games in {time.time() - start:.0f} s")


__all__ = [
    "BALROG_POOL_SIZE",
    "DEFAULT_MAX_STEPS",
    "FAMILIES",
    "SETTINGS",
    "TextWorldTextEnv",
    "TextWorldWalkthroughAgent",
    "balrog_command",
    "balrog_feedback",
    "balrog_instruction",
    "build_game",
    "cache_root",
    "clean_feedback",
    "game_dir",
    "settings_for",
]


if __name__ == "__main__":
    main()
