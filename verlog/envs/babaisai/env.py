"""BabaIsAI as a text environment: observations, action parsing, rewards and episode limits.

Two protocols (``protocol=``):

* ``"verlog"`` (the training variant): the model sees the active rules, the object it controls,
  how far the border is, and where every object and word block is relative to it; it answers
  with reasoning and ``ACTION: up`` (or ``down``/``left``/``right``/``idle``), matched tolerantly.
  A win counts once the rules are recomputed after a move; levels the solver cannot win within
  the step cap are redrawn. An answer naming no valid action runs ``idle`` and costs
  ``invalid_action_penalty``.
* ``"balrog"``: BALROG's BabaIsAI. The observation is ``Active rules:`` (one rule a line) and
  ``Objects on the map:`` (one line per cell holding an object or word block, the upper one of a stack, row by row, as
  "rule `ball` 2 steps to the right and 1 step up"; like BALROG's text, offsets to the left or up
  always say "step"; baba objects are never listed, and the object the offsets are measured from,
  when it is not a baba, gives an empty line). The win is checked with the rules in force before
  the move, as the original game does; levels are not checked for solvability (the benchmark's
  are not). An answer must be exactly an action name (see :mod:`verlog.envs.balrog_protocol`);
  otherwise ``idle`` runs. No penalty. When no object is left to measure from (the rules make
  nothing YOU, or nothing of the last YOU rule's kind is on the map), BALROG's wrapper starts a
  new level of the task and the episode goes on (the step count runs on); the observation of that
  step is what BALROG's wrapper prints then (:func:`broken_you_text`). A YOU object destroyed by
  DEFEAT ends the episode as a loss (no BALROG task has DEFEAT).

The image of an observation (BALROG's vision protocol: :meth:`BabaIsAIEnv.observation_image`) is
the level as the original game draws it (:mod:`.image`).

Reward 1 for winning.
"""

from __future__ import annotations

import random
from typing import Any

from verlog.envs import balrog_protocol
from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.base import EpisodeSeeds, StepResult, TextEnv
from verlog.envs.family import check_protocol
from verlog.envs.progression import goal_value
from verlog.envs.text import count, offset_phrase
from verlog.step_info import step_info

from . import game
from .game import ACTIONS, OBJECT_NAMES, GameState, kind_name, render_ascii
from .image import FACING
from .levels import TASKS, Level, generate

#: extra phrasings accepted for each action (matching is case- and punctuation-insensitive)
SYNONYMS: dict[str, str] = {
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
    "wait": "idle",
    "stay": "idle",
    "noop": "idle",
    "no op": "idle",
    "do nothing": "idle",
    **{f"{verb} {a}": a for verb in ("move", "go", "step", "walk") for a in ACTIONS[1:]},
    **{
        f"{verb} {d}": a
        for verb in ("move", "go")
        for d, a in (("north", "up"), ("south", "down"), ("west", "left"), ("east", "right"))
    },
}

_ACTION_HELP = {
    "idle": "wait for one step",
    "up": "take one step up",
    "down": "take one step down",
    "left": "take one step to the left",
    "right": "take one step to the right",
}


#: the instruction under BALROG's protocol: BALROG's facts (the actions, tips on rules), verlog's words
_BALROG_INSTRUCTION = (
    "Baba Is You is a puzzle game in which the rules of each level can be changed. These are the "
    "actions you can take, each followed by what it does:\n\n"
    + ",\n".join(
        f"{a}: {h}"
        for a, h in (
            ("idle", "wait one step"),
            ("up", "move one step up"),
            ("right", "move one step to the right"),
            ("down", "move one step down"),
            ("left", "move one step to the left"),
        )
    )
    + ".\n\nTips:\n"
    "- Look at the whole level: every object and every word block.\n"
    '- Rules are word blocks in a line, "[Subject] IS [Property]" (e.g. "BABA IS YOU").\n'
    "- Moving word blocks breaks rules or makes new ones.\n"
    '- Only things that are not "STOP" (or otherwise fixed) can be moved.\n'
    '- The goal is usually to reach an object that is "WIN", but rules can change that.\n'
    "- Changing a rule can change how objects behave in surprising ways.\n"
    "- When stuck, break an existing rule or build a new one.\n"
    "- Sometimes the answer is to become another object or to change what counts as winning.\n\n"
    "PLAY!"
)


def relative_position(dx: int, dy: int) -> str:
    """Words for an offset from the player: ``"2 steps to the left and 1 step up"``."""
    return offset_phrase((dx, "to the right", "to the left"), (dy, "down", "up"), here="at your position")


def describe(state: GameState, anchor: tuple[int, int] | None = None, show_border: bool = True) -> str:
    """The observation text for ``state``.

    Lists the active rules, then every word block (as ``rule `is```) and object other than the
    one the player controls, relative to that object, in reading order (top row first).
    ``anchor`` is the reference cell when no object is YOU (e.g. after losing).
    """
    rules = state.rules
    you = state.you_positions()
    ref = you[0] if you else anchor
    lines = ["Active rules: " + (", ".join(rules.texts()) or "none")]
    if ref is None:
        lines.append("You control nothing.")
        return "\n".join(lines)
    rx, ry = ref
    controlled = [kind_name(k) for k, x, y in state.iter_objects() if (x, y) == ref and rules.props[k] & game.YOU]
    if controlled:
        lines.append(f"You are the {controlled[0]}.")
    else:
        lines.append("You control nothing any more.")
    if show_border:
        lines.append(
            "The level's impassable border is "
            f"{count(rx, 'step')} to the left, {count(state.width - 1 - rx, 'step')} to the right, "
            f"{count(ry, 'step')} up and {count(state.height - 1 - ry, 'step')} down."
        )
    entries: list[tuple[int, int, int, str]] = []
    for k, x, y in state.iter_words():
        entries.append((y, x, 0, f"rule `{kind_name(k)}`"))
    skipped_self = not controlled
    for k, x, y in state.iter_objects():
        if not skipped_self and (x, y) == ref and kind_name(k) == controlled[0]:
            skipped_self = True  # the controlled object is the reference point itself
            continue
        entries.append((y, x, 1, kind_name(k)))
    lines.append("Objects on the map:")
    for y, x, _, label in sorted(entries):
        lines.append(f"{label} {relative_position(x - rx, y - ry)}")
    return "\n".join(lines)


def _balrog_offset(dx: int, dy: int) -> str:
    """BALROG's wording of an offset (``steps`` only for a positive count above one)."""

    def unit(v: int) -> str:
        return "steps" if v > 1 else "step"

    horizontal = f"{dx} {unit(dx)} to the right" if dx > 0 else (f"{-dx} {unit(dx)} to the left" if dx < 0 else "")
    vertical = f"{dy} {unit(dy)} down" if dy > 0 else (f"{-dy} {unit(dy)} up" if dy < 0 else "")
    return " and ".join(part for part in (horizontal, vertical) if part)


def balrog_reference(state: GameState) -> tuple[int | None, tuple[int, int] | None]:
    """What BALROG measures offsets from: the kind of the last YOU rule and the first cell, row by
    row, holding an object of that kind (``None`` when there is no such rule or object)."""
    you_rules = [s for s, p in state.rules.rules if p == game.property_word("you")]
    you_kind = you_rules[-1] if you_rules else None
    if you_kind is None:
        return None, None
    spots = sorted((y, x) for k, x, y in state.iter_objects() if k == you_kind)
    return you_kind, ((spots[0][1], spots[0][0]) if spots else None)


def _balrog_rules(state: GameState) -> str:
    return "\n".join(f"{OBJECT_NAMES[s]} is {kind_name(p)}" for s, p in state.rules.rules if p > game.IS)


def describe_balrog(state: GameState) -> str:
    """The observation text of ``state`` as BALROG shows it (see the module docstring).

    One thing per cell is named, the one on top: a word block, else an object you control, else
    the object there (objects never stack in these levels otherwise). The reference is the first
    cell, row by row, holding an object of the last YOU rule's type.
    """
    rules = state.rules
    lines = ["Active rules:", *_balrog_rules(state).splitlines()]
    cells: dict[tuple[int, int], list[int]] = {}
    for k, x, y in state.iter_objects():
        cells.setdefault((x, y), []).append(k)
    words = {(x, y): k for k, x, y in state.iter_words()}
    you_kind, ref = balrog_reference(state)
    entries: list[str] = []
    if ref is not None:
        for y in range(state.height):
            for x in range(state.width):
                if (x, y) in words:
                    entries.append(f"rule `{kind_name(words[(x, y)])}` " + _balrog_offset(x - ref[0], y - ref[1]))
                    continue
                here = cells.get((x, y))
                if not here:
                    continue
                controlled = [k for k in here if rules.props[k] & game.YOU]
                top = controlled[0] if controlled else here[0]
                if OBJECT_NAMES[top] == "baba":
                    continue  # BALROG lists no baba
                if top == you_kind and (x, y) == ref:
                    entries.append("")  # the object measured from: BALROG's line for it is empty
                    continue
                entries.append(f"{OBJECT_NAMES[top]} {_balrog_offset(x - ref[0], y - ref[1])}".rstrip())
    return "\n".join(lines) + "\n\nObjects on the map:\n" + "\n".join(entries)


#: how BALROG's wrapper prints a fresh level's observation when it restarts one mid-episode: the
#: ``repr`` of its observation dictionary (a ``defaultdict`` with a lambda default, the text and
#: the rendered image, 32 pixels a cell); the two memory addresses differ from run to run there
_RESTART_DICT = (
    "defaultdict(<function BabaIsAIWrapper.textworld_process_obsv.<locals>.<lambda> at 0x7f0000000000>, "
    "{{'text': {{'long_term_context': {text}, 'short_term_context': ''}}, "
    "'image': <PIL.Image.Image image mode=RGB size={width}x{height} at 0x7F0000000000>}})"
)


def broken_you_text(broken: GameState, fresh: GameState) -> str:
    """The observation BALROG's wrapper gives when nothing is left to measure from in ``broken``
    and it starts the new level ``fresh``: a line saying so, run into the broken level's rules,
    then, as the objects on the map, the fresh level's observation dictionary as Python prints it
    (with fixed memory addresses)."""
    fresh_dict = _RESTART_DICT.format(
        text=repr(describe_balrog(fresh)), width=32 * fresh.width, height=32 * fresh.height
    )
    return (
        "[...] IS YOU rule was broken, environment reset"
        f"Active rules:\n{_balrog_rules(broken)}\n\nObjects on the map:\n{fresh_dict}"
    )


class BabaIsAIEnv(TextEnv):
    """One BabaIsAI task family as a :class:`TextEnv`.

    ``task``: a name from :data:`TASKS`. ``seed``: the first :meth:`reset` without a seed plays
    this seed's level; later ones draw seeds from a stream derived from it. ``max_steps``: the
    episode is truncated after this many actions. ``invalid_action_penalty``: subtracted from a
    turn whose answer named no valid action. ``show_border``: tell the model how far the border
    is. ``ensure_solvable``: redraw levels the solver cannot win within ``max_steps``.
    """

    name = "babaisai"
    actions = ACTIONS
    action_help = _ACTION_HELP

    def __init__(
        self,
        task: str = "goto_win-distr_obj",
        seed: int | None = None,
        max_steps: int = 100,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        show_border: bool = True,
        ensure_solvable: bool | None = None,
        protocol: str = "verlog",
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown BabaIsAI task {task!r}; valid tasks: {', '.join(TASKS)}")
        check_protocol(protocol)
        balrog = protocol == "balrog"
        self.task = task
        self.protocol = protocol
        #: when a win counts: "current" (rules recomputed first) or "previous" (the original's)
        self.win_rule = "previous" if balrog else "current"
        self.name = f"babaisai:{task}"
        self.max_steps = max_steps
        self.invalid_action_penalty = 0.0 if balrog else invalid_action_penalty
        self.show_border = show_border
        self.ensure_solvable = (not balrog) if ensure_solvable is None else ensure_solvable
        self._seeds = EpisodeSeeds(seed)
        #: levels BALROG's rule restarted in this episode (nothing left to measure from)
        self.levels_restarted = 0
        self.seed: int | None = None
        self.level: Level | None = None
        self._state: GameState | None = None
        self._anchor: tuple[int, int] | None = None
        #: the direction of the player's last move as the original numbers it (0 right, 1 down,
        #: 2 left, 3 up; a level starts facing right): which way the image's baba points
        self.facing = 0
        self.steps_taken = 0
        self.done = False
        self.won = False

    # -- episode ---------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        self.seed = seed = self._seeds.next(seed)
        self._draw_level(random.Random(seed))
        self.levels_restarted = 0
        self.steps_taken = 0
        self.done = False
        self.won = False
        return self.observation()

    def _draw_level(self, rng: random.Random) -> None:
        self.level = generate(
            self.task,
            rng,
            max_steps=self.max_steps,
            ensure_solvable=self.ensure_solvable,
            win_rule=self.win_rule,
            stack_words=self.protocol == "balrog",
        )
        self._state = self.level.state
        self._anchor = self._state.you_positions()[0]
        self.facing = 0

    def reset_to(self, state: GameState) -> str:
        """Start an episode from a given state (custom puzzles, tests); returns its observation."""
        you = state.you_positions()
        if not you:
            raise ValueError("the state has no object that is YOU")
        self.seed = None
        self.level = Level(self.task, state, win_object="", distractor=None, plan="")
        self._state = state
        self._anchor = you[0]
        self.facing = 0
        self.levels_restarted = 0
        self.steps_taken = 0
        self.done = False
        self.won = False
        return self.observation()

    def step(self, action_text: str) -> StepResult:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        if self.protocol == "balrog":
            chosen = balrog_protocol.parse_answer(action_text, ACTIONS)
        else:
            chosen = parse_action(action_text, ACTIONS, SYNONYMS).action
        valid = chosen is not None
        action = chosen or "idle"
        reward = 0.0 if valid else -self.invalid_action_penalty
        outcome = game.step(self._state, action, self.win_rule)
        self._state = outcome.state
        if action != "idle":  # the original turns the player even when the move is blocked
            self.facing = FACING[action]
        you = self._state.you_positions()
        if you:
            self._anchor = you[0]
        self.steps_taken += 1
        lost, observation = outcome.lost, None
        if (
            self.protocol == "balrog"
            and not (outcome.won or outcome.lost)
            and balrog_reference(outcome.state)[1] is None
        ):
            # nothing to measure from (the original's step reports only DEFEAT as a loss): BALROG's
            # wrapper starts a new level and the episode goes on
            broken = outcome.state
            self.levels_restarted += 1
            self._draw_level(random.Random(f"{self.seed}/{self.levels_restarted}"))
            observation = broken_you_text(broken, self.state)
        terminated = outcome.won or lost
        truncated = not terminated and self.steps_taken >= self.max_steps
        if outcome.won:
            reward += 1.0
        self.won = outcome.won
        self.done = terminated or truncated
        extra: dict[str, Any] = {"levels_restarted": self.levels_restarted} if self.levels_restarted else {}
        info = step_info(
            action,
            valid,
            self.steps_taken,
            done=self.done,
            success=outcome.won,
            rules=self._state.rules.texts(),
            won=outcome.won,
            lost=lost,
            progression=goal_value(outcome.won),  # BALROG's: 1 on a win
            **extra,
        )
        return StepResult(observation or self.observation(), reward, terminated, truncated, info)

    # -- views -----------------------------------------------------------------------------

    @property
    def state(self) -> GameState:
        """The current game state (read it to plan; change it only through :meth:`step`)."""
        if self._state is None:
            raise RuntimeError("call reset() first")
        return self._state

    def observation(self) -> str:
        """The text the model sees for the current state."""
        if self.protocol == "balrog":
            return describe_balrog(self.state)
        return describe(self.state, self._anchor, self.show_border)

    def render(self) -> str:
        """ASCII drawing of the grid (for debugging and ``verlog play``)."""
        return render_ascii(self.state)

    def observation_image(self) -> Any:
        """The level as BALROG's BabaIsAI wrapper shows it: the original game's
        ``render(mode="rgb_array")``, the whole level at 32 pixels a cell
        (:func:`verlog.envs.babaisai.image.render_level`)."""
        from verlog.envs.balrog_vision import rgb_image

        from .image import render_level

        return rgb_image(render_level(self.state, self.facing))

    @property
    def instruction(self) -> str:
        if self.protocol == "balrog":
            return _BALROG_INSTRUCTION
        actions = self.actions_text()
        return (
            "You are playing Baba Is You, a puzzle game on a grid where the rules themselves are "
            "objects you can move.\n\n"
            "The grid holds objects (baba, wall, key, ball, door) and word blocks, shown as "
            "rule `word`. Three word blocks in a line, left to right or top to bottom, form a "
            "rule: NOUN IS PROPERTY (e.g. `baba` `is` `you`) or NOUN IS NOUN (e.g. `key` `is` "
            "`ball` turns every key into a ball). Properties: YOU = you control that object; "
            "WIN = touching it with an object you control wins; STOP = it blocks movement; "
            "PUSH = it gets pushed; DEFEAT = it destroys the object you control. An object that "
            "no rule mentions does nothing and can be walked over. The rules are updated after "
            "every move.\n\n"
            "Word blocks can always be pushed: walk into one and it moves one cell in the same "
            "direction, pushing any word blocks behind it along, unless the line would hit the "
            "border or a STOP object, in which case nothing moves. Pushing a word out of its line "
            "breaks that rule (e.g. breaking `wall` `is` `stop` lets you walk through walls); "
            "pushing words into a line makes a new rule. The level is surrounded by an impassable "
            "border.\n\n"
            "Goal: move an object you control (YOU) onto an object that is WIN. You may need to "
            "break or make rules first. If no object is YOU any more, you lose. You have "
            f"{self.max_steps} steps.\n\n"
            "Each observation lists the active rules and where every object and word block is, "
            "relative to the object you control; up is toward the top row.\n\n"
            f"Valid actions:\n{actions}\n\n{ANSWER_FORMAT}"
        )
