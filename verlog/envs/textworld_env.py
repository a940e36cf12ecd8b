"""TextWorld games (the ``textworld`` package) played in text: BALROG's three families.

``textworld:treasure_hunter``
    Find a given object in a house of rooms, through closed and locked doors and containers
    (keys are in the house); picking up the wrong object loses. One point for the right object.
``textworld:coin_collector``
    Find the coin in a chain of rooms. One point.
``textworld:cooking``
    The cooking game: find the cookbook, gather its ingredients from the house, cut and cook
    them as it says, prepare the meal and eat it. A point per required step (17 with the
    defaults); burning or wrongly preparing an ingredient loses.

Games are generated offline, at ``reset``, from (family, settings, seed) with TextWorld's own
generators (``textworld.challenges``, what ``tw-make`` runs) and compiled with the Inform 7
compiler shipped in the wheel; each is cached under
``verlog.models.verlog_cache_dir()/textworld/<family>-<settings>/seed-<seed>/`` (built in a
temporary folder, then renamed into place, so concurrent processes never see half a game). A
seed whose settings admit no game (TextWorld raises ``QuestGenerationError`` for a few) moves on
to the next candidate seed, deterministically; ``info["game_seed"]`` says which one was used.

Settings (keyword arguments) and their defaults:

* treasure hunter: ``level=26``. BALROG plays level 30 (20 rooms, locked doors and containers,
  a 20-step quest); generating one level-30 game takes from 10 seconds to several minutes on
  these machines (TextWorld's quest search backtracks), so the default is level 26: the same
  house and locks, a 12-step quest, about 5 seconds to generate. ``level=30`` works, slowly.
* coin collector: ``level=220`` (BALROG's).
* cooking: ``recipe=5, take=5, go=12, open=True, cook=True, cut=True, drop=False,
  split="train"`` (BALROG's recipe size, 12 locations, maximum score 17); the recipe seed is
  the game seed.

The model reads the game's own text for each command (the banner and the status bar removed),
then ``Location``, ``Inventory``, the score and the valid actions: TextWorld's admissible
commands, which are the actions :meth:`TextWorldTextEnv.valid_actions` accepts. The game's goal
text goes in the instruction. Reward is the score gained by the step; the episode ends when the
game is won or lost, or after ``max_steps`` commands (80, BALROG's). An answer that names no
admissible command runs ``look`` and pays the invalid-action penalty. Progression is BALROG's
``max(score / max_score, won)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping

from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.progression import textworld_value

#: family -> (TextWorld challenge name, default settings)
FAMILIES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "treasure_hunter": ("tw-treasure_hunter", {"level": 26}),
    "coin_collector": ("tw-coin_collector", {"level": 220}),
    "cooking": (
        "tw-cooking",
        {"recipe": 5, "take": 5, "go": 12, "open": True, "cook": True, "cut": True, "drop": False, "split": "train"},
    ),
}
DEFAULT_MAX_STEPS = 80  # BALROG
DEFAULT_ACTION = "look"
#: candidate seeds tried per requested seed before giving up
MAX_GENERATION_TRIES = 20
_SEED_STRIDE = 1_000_003  # candidate k of seed s is s + k * stride

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

_STATUS_BAR = re.compile(r"\n\s*>\s*[^\n]*$")
_ROOM = re.compile(r"-=\s*(.+?)\s*=-")


def _unknown_family(family: str) -> ValueError:
    valid = ", ".join(f"textworld:{f}" for f in FAMILIES)
    return ValueError(f"unknown TextWorld game {family!r}; valid names: {valid}")


def settings_for(family: str, **overrides: Any) -> dict[str, Any]:
    """The generator settings of ``family`` with ``overrides`` applied (unknown keys rejected)."""
    if family not in FAMILIES:
        raise _unknown_family(family)
    settings = dict(FAMILIES[family][1])
    for key, value in overrides.items():
        if key not in settings:
            raise ValueError(
                f"unknown setting {key!r} for textworld:{family}; valid: {', '.join(settings)}"
            )
        settings[key] = value
    return settings


def _settings_tag(settings: Mapping[str, Any]) -> str:
    parts = []
    for key, value in sorted(settings.items()):
        if isinstance(value, bool):
            parts.append(key if value else f"no{key}")
        else:
            parts.append(f"{key}{value}")
    return "-".join(parts)


def cache_root() -> Path:
    """Where generated games are cached: ``verlog_cache_dir()/textworld``."""
    from verlog.models import verlog_cache_dir

    return verlog_cache_dir() / "textworld"


def game_dir(family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None) -> Path:
    """The cache folder of one game (it holds ``game.z8`` and ``game.json`` once built)."""
    return (root or cache_root()) / f"{family}-{_settings_tag(settings)}" / f"seed-{seed}"


def _generate_game(family: str, settings: Mapping[str, Any], seed: int) -> Any:
    """A ``textworld.Game`` of ``family`` for ``seed`` (may raise ``QuestGenerationError``)."""
    from textworld.challenges import CHALLENGES
    from textworld.generator.game import GameOptions

    challenge = FAMILIES[family][0]
    options = GameOptions()
    options.seeds = seed
    settings = dict(settings)
    if family == "cooking":
        settings["recipe_seed"] = seed
    make = CHALLENGES[challenge][1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(settings, options)


#: one game generated at a time per process: TextWorld's generator is not thread-safe (games built
#: concurrently in worker threads fail with ``IndexError: pop from empty list`` or parse errors)
_GENERATION_LOCK = threading.Lock()


def build_game(family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None) -> tuple[Path, int]:
    """The compiled game file of (family, settings, seed), generated on first use.

    Returns the ``.z8`` path and the seed actually used (a later candidate when ``seed`` admits
    no game). Building happens in a temporary folder renamed into place.
    """
    from textworld.generator import QuestGenerationError, compile_game
    from textworld.generator.game import GameOptions

    for k in range(MAX_GENERATION_TRIES):
        candidate = seed + k * _SEED_STRIDE
        final = game_dir(family, settings, candidate, root)
        if (final / "game.z8").is_file():
            return final / "game.z8", candidate
        failed = final.with_name(final.name + ".failed")
        if failed.is_file():  # this candidate is known to admit no game
            continue
        final.parent.mkdir(parents=True, exist_ok=True)
        with _GENERATION_LOCK:  # TextWorld's generator and compiler share global state
            if (final / "game.z8").is_file():  # another thread built it meanwhile
                return final / "game.z8", candidate
            try:
                game = _generate_game(family, settings, candidate)
            except QuestGenerationError:
                _write_atomic(failed, "QuestGenerationError\n")
                continue
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
            try:
                options = GameOptions()
                options.path = str(tmp / "game.z8")
                options.force_recompile = True
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compile_game(game, options)
                (tmp / "game.ni").unlink(missing_ok=True)
                (tmp / "meta.json").write_text(
                    json.dumps({"family": family, "settings": dict(settings), "seed": candidate}, indent=1)
                )
                try:
                    os.rename(tmp, final)
                except OSError:  # another process finished the same game first
                    if not (final / "game.z8").is_file():
                        raise
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        return final / "game.z8", candidate
    raise RuntimeError(
        f"TextWorld could not generate a {family} game for seed {seed} "
        f"({MAX_GENERATION_TRIES} candidate seeds tried) with settings {dict(settings)}"
    )


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def clean_feedback(text: str, objective: str = "") -> str:
    """The game's text without the banner, the goal paragraph and the trailing status bar."""
    text = _STATUS_BAR.sub("", text.rstrip())
    text = text.split("*** The End ***", 1)[0]  # the end-of-game screen (score, RESTART ...)
    if objective and objective in text:
        text = text.split(objective, 1)[1]
    else:
        # the start-of-game banner is ASCII art made of $, \ | _ and spaces
        lines = text.splitlines()
        while lines and (not lines[0].strip() or re.fullmatch(r"[\s$\\|/_<>]+", lines[0])):
            lines.pop(0)
        text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


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
        max_steps: int = DEFAULT_MAX_STEPS,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        cache_dir: str | os.PathLike | None = None,
        **settings: Any,
    ) -> None:
        self.family = family
        self.settings = settings_for(family, **settings)
        self.name = f"textworld:{family}"
        self.max_steps = max_steps
        self.invalid_action_penalty = invalid_action_penalty
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._next_seed = seed if seed is not None else 0
        self._game_env: Any = None
        self._game_path: Path | None = None
        self._state: Any = None
        self._steps = 0
        self._done = True
        self._score = 0.0
        self._observation = ""
        self.game_seed: int | None = None
        self.seed: int | None = None

    # -- game files ------------------------------------------------------------------------------

    def _start(self, path: Path) -> None:
        import textworld

        if self._game_path == path and self._game_env is not None:
            return
        self.close()
        infos = textworld.EnvInfos(
            admissible_commands=True, won=True, lost=True, score=True, max_score=True,
            objective=True, description=True, inventory=True, moves=True, extras=["walkthrough"],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._game_env = textworld.start(str(path), request_infos=infos)
        self._game_path = path

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
        state = self._state
        inventory = re.sub(r"\s+", " ", str(state["inventory"] or "").strip())
        parts = [feedback or "(nothing happens)"]
        if self.location:
            parts.append(f"Location: {self.location}.")
        parts.append(f"Inventory: {inventory or 'You are carrying nothing.'}")
        parts.append(f"Score: {int(self._score)} of {int(self.max_score)}. Moves: {self._steps} of {self.max_steps}.")
        parts.append(f"Valid actions: {', '.join(self.valid_actions())}")
        return "\n".join(parts)

    # -- TextEnv ------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        if seed is None:
            seed = self._next_seed
        self._next_seed = seed + 1
        path, used = build_game(self.family, self.settings, seed, self._root())
        self._start(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._state = self._game_env.reset()
        self.seed, self.game_seed = seed, used
        self._steps = 0
        self._score = float(self._state["score"] or 0)
        self._done = False
        self._observation = self._render(clean_feedback(self._state.feedback, self.objective))
        return self._observation

    def _root(self) -> Path | None:
        return self.cache_dir

    def step(self, action_text: str) -> StepResult:
        if self._done or self._state is None:
            raise RuntimeError("the episode is over: call reset() first")
        parsed = parse_action(action_text, self.valid_actions(), SYNONYMS)
        command = parsed.action if parsed.action is not None else DEFAULT_ACTION
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._state, _, game_done = self._game_env.step(command)
        self._steps += 1
        score = float(self._state["score"] or 0)
        reward = score - self._score
        self._score = score
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        terminated = won or lost or bool(game_done)
        truncated = not terminated and self._steps >= self.max_steps
        if not parsed.valid:
            reward -= self.invalid_action_penalty
        self._done = terminated or truncated
        info: dict[str, Any] = {
            "action": command,
            "valid_action": parsed.valid,
            "step": self._steps,
            "score": score,
            "max_score": self.max_score,
            "won": won,
            "lost": lost,
            "progression": textworld_value(score, self.max_score, won),
            "game_seed": self.game_seed,
        }
        if self._done:
            info["success"] = won
        feedback = clean_feedback(self._state.feedback)
        if won:
            feedback += "\n(You won the game.)"
        elif lost:
            feedback += "\n(You lost the game.)"
        self._observation = self._render(feedback)
        return StepResult(self._observation, reward, terminated, truncated, info)

    def valid_actions(self) -> list[str]:
        if self._state is None:
            return []
        return list(self._state["admissible_commands"] or [])

    @property
    def instruction(self) -> str:
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
                self._game_env.close()
            except Exception:  # pragma: no cover
                pass
        self._game_env = None
        self._game_path = None


class TextWorldWalkthroughAgent:
    """Plays the game's own walkthrough, one command per turn, through the text interface.

    TextWorld's walkthroughs sometimes repeat a step that is already done (``open fridge`` when
    the fridge stands open): a command missing from the observation's ``Valid actions:`` line is
    such a no-op, so the agent skips it.
    """

    def __init__(self, env: TextWorldTextEnv) -> None:
        self.env = env
        self._plan: list[str] = []

    def reset(self) -> None:
        self._plan = list(self.env.walkthrough)

    def act(self, observation: str) -> str:
        valid = _valid_actions_in(observation)
        while len(self._plan) > 1 and valid is not None and self._plan[0] not in valid:
            self._plan.pop(0)
        command = self._plan.pop(0) if self._plan else "look"
        return f"ACTION: {command}"


def _valid_actions_in(observation: str) -> set[str] | None:
    for line in reversed(observation.splitlines()):
        if line.startswith("Valid actions: "):
            return set(line[len("Valid actions: "):].split(", "))
    return None
