"""Procedural BabaIsAI levels: the benchmark's task families, generated from a seed.

Task names follow the benchmark (Cloos et al., 2024), as ``family-modifier-...``:

* single room (8x8 with the border): the rule ``BABA IS YOU`` sits against the bottom-left
  border (no push can break it) and ``<OBJ> IS WIN`` against the top-left border.

  - ``goto_win``: walk onto the WIN object.
  - ``make_win``: the noun of the win rule has been pushed away; push it back to re-form the rule,
    then walk onto the object.
  - ``distr_obj``: a second object of another type is present (not WIN).
  - ``distr_rule``: a loose noun word for that other type lies where it can never complete a
    WIN rule.

* two rooms (13x9 with the border) split by a column of ``wall`` objects; ``BABA IS YOU`` is
  unbreakable in the bottom-left corner, ``WALL IS STOP`` lies in the left room (breakable by
  pushing ``IS`` or ``STOP`` out of line), ``<OBJ> IS WIN`` sits in the top-right corner of the
  right room. Baba starts in the left room.

  - ``two_room-goto_win``: ``WALL IS STOP`` is already broken (one of its blocks lies loose in
    the left room) and the WIN object is in the left room.
  - ``two_room-break_stop-goto_win``: ``WALL IS STOP`` is active and the WIN object is in the
    right room: break the rule, cross the wall line, reach the object.
  - ``two_room-maybe_break_stop-goto_win``: ``WALL IS STOP`` is active and the WIN object is in
    either room, so breaking the rule is needed only sometimes.
  - ``distr_obj`` / ``distr_obj_rule``: as above; with a distractor object present the distractor
    noun is placed against the right room's border where it can never make a WIN rule.

Every generated level is checked with the BFS solver (within the step budget) and redrawn from the
same random stream if unsolvable, so each seed gives one fixed, solvable level (unless
``ensure_solvable=False``, BALROG's way: levels as drawn).

The two ``*-distr_win_rule`` tasks add a second WIN rule, for a type absent from the level, at a
fixed place in the right room; the original lays it over whatever word lies there (the
distractor noun, or the WIN rule's noun when that rule starts broken). With ``stack_words=True``
(BALROG's protocol) the covered word stays under it, as in the original (see :mod:`.game`);
otherwise such a draw is redrawn.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass, field
from typing import Callable

from .game import IS, GameState, noun_word, object_kind, property_word

#: the object types that can be the WIN object or the distractor
GOAL_OBJECTS: tuple[str, ...] = ("ball", "key", "door")

Area = tuple[int, int, int, int]  # x_min, y_min, x_max, y_max (inclusive)


@dataclass(frozen=True)
class TaskConfig:
    """What varies between task families (see the module docstring)."""

    layout: str  # one_room | two_room | make_you | make_wall_win
    break_win: bool = False  # the WIN rule starts broken (its noun pushed away)
    stop_broken: bool = False  # two rooms: WALL IS STOP starts broken
    win_area: str = "room"  # where the WIN object (and the distractor) go: left / right / anywhere
    distractor_obj: bool = False
    distractor_rule: bool = False  # a loose noun word
    irrelevant_rule: bool = False  # ... naming a type absent from the level
    distractor_win_rule: bool = False  # an active WIN rule for a type absent from the level

    @property
    def two_room(self) -> bool:
        return self.layout != "one_room"


def _one(**flags: bool) -> TaskConfig:
    return TaskConfig(layout="one_room", **flags)


def _two(win_area: str, **flags: bool) -> TaskConfig:
    return TaskConfig(layout="two_room", win_area=win_area, **flags)


_OBJ = {"distractor_obj": True}
_RULE = {"distractor_rule": True}
_OBJ_RULE = {"distractor_obj": True, "distractor_rule": True}
_IRRELEVANT = {"distractor_obj": True, "distractor_rule": True, "irrelevant_rule": True}

#: the 40 tasks of BabaIsAI's benchmark, in BALROG's order
TASK_CONFIGS: dict[str, TaskConfig] = {
    "make_win-distr_obj_rule": _one(break_win=True, **_OBJ_RULE),
    "goto_win-distr_obj_rule": _one(**_OBJ_RULE),
    "goto_win": _one(),
    "goto_win-distr_obj": _one(**_OBJ),
    "goto_win-distr_rule": _one(**_RULE),
    "goto_win-distr_obj-irrelevant_rule": _one(**_IRRELEVANT),
    "make_win-distr_obj": _one(break_win=True, **_OBJ),
    "make_win-distr_rule": _one(break_win=True, **_RULE),
    "make_win": _one(break_win=True),
    "make_win-distr_obj-irrelevant_rule": _one(break_win=True, **_IRRELEVANT),
    "two_room-goto_win": _two("left", stop_broken=True),
    "two_room-goto_win-distr_obj_rule": _two("left", stop_broken=True, **_OBJ_RULE),
    "two_room-goto_win-distr_rule": _two("left", stop_broken=True, **_RULE),
    "two_room-goto_win-distr_obj": _two("left", stop_broken=True, **_OBJ),
    "two_room-goto_win-distr_obj-irrelevant_rule": _two("left", stop_broken=True, **_IRRELEVANT),
    "two_room-goto_win-distr_win_rule": _two("left", stop_broken=True, distractor_win_rule=True, **_OBJ_RULE),
    "two_room-break_stop-goto_win-distr_obj_rule": _two("right", **_OBJ_RULE),
    "two_room-break_stop-goto_win-distr_obj": _two("right", **_OBJ),
    "two_room-break_stop-goto_win-distr_rule": _two("right", **_RULE),
    "two_room-break_stop-goto_win-distr_obj-irrelevant_rule": _two("right", **_IRRELEVANT),
    "two_room-break_stop-goto_win": _two("right"),
    "two_room-maybe_break_stop-goto_win-distr_obj_rule": _two("anywhere", **_OBJ_RULE),
    "two_room-maybe_break_stop-goto_win": _two("anywhere"),
    "two_room-maybe_break_stop-goto_win-distr_obj": _two("anywhere", **_OBJ),
    "two_room-maybe_break_stop-goto_win-distr_rule": _two("anywhere", **_RULE),
    "two_room-maybe_break_stop-goto_win-distr_obj-irrelevant_rule": _two("anywhere", **_IRRELEVANT),
    "two_room-make_win-distr_obj_rule": _two("left", stop_broken=True, break_win=True, **_OBJ_RULE),
    "two_room-make_win-distr_rule": _two("left", stop_broken=True, break_win=True, **_RULE),
    "two_room-make_win": _two("left", stop_broken=True, break_win=True),
    "two_room-make_win-distr_obj-irrelevant_rule": _two("left", stop_broken=True, break_win=True, **_IRRELEVANT),
    "two_room-make_win-distr_obj": _two("left", stop_broken=True, break_win=True, **_OBJ),
    "two_room-make_win-distr_win_rule": _two(
        "left", stop_broken=True, break_win=True, distractor_win_rule=True, **_OBJ_RULE
    ),
    "two_room-break_stop-make_win-distr_obj_rule": _two("right", break_win=True, **_OBJ_RULE),
    "two_room-break_stop-make_win-distr_rule": _two("right", break_win=True, **_RULE),
    "two_room-break_stop-make_win": _two("right", break_win=True),
    "two_room-break_stop-make_win-distr_obj-irrelevant_rule": _two("right", break_win=True, **_IRRELEVANT),
    "two_room-break_stop-make_win-distr_obj": _two("right", break_win=True, **_OBJ),
    "two_room-make_you": TaskConfig(layout="make_you", **_OBJ_RULE),
    "two_room-make_you-make_win": TaskConfig(layout="make_you", break_win=True, **_OBJ_RULE),
    "two_room-make_wall_win": TaskConfig(layout="make_wall_win", **_IRRELEVANT),
}

#: every task name :func:`generate` accepts
TASKS: tuple[str, ...] = tuple(TASK_CONFIGS)


@dataclass(frozen=True)
class Level:
    """A generated level: its first state plus what it was built to test."""

    task: str
    state: GameState
    win_object: str  # the type named in the WIN rule
    distractor: str | None  # the distractor object type, when one is present
    plan: str  # the intended solution in words, e.g. "break[wall is stop], goto[key]"
    redraws: int = 0  # unsolvable layouts drawn (and thrown away) before this one


@dataclass
class _Layout:
    """A level under construction: cells are claimed one thing at a time (one thing per cell)."""

    width: int
    height: int
    rng: random.Random
    words: dict[tuple[int, int], int] = field(default_factory=dict)
    objects: dict[tuple[int, int], int] = field(default_factory=dict)
    #: words another was laid over, with their cells (they lie under it)
    covered: list[tuple[tuple[int, int], int]] = field(default_factory=list)

    def free(self, x: int, y: int) -> bool:
        return (x, y) not in self.words and (x, y) not in self.objects

    def random_free(self, area: Area) -> tuple[int, int]:
        x0, y0, x1, y1 = area
        cells = [(x, y) for y in range(y0, y1 + 1) for x in range(x0, x1 + 1) if self.free(x, y)]
        if not cells:
            raise RuntimeError(f"no free cell in {area}")
        return self.rng.choice(cells)

    def put_rule(
        self, noun: str, predicate: int, x: int, y: int, overwrite: bool = False, stack: bool = False
    ) -> list[tuple[int, int]]:
        """Lay ``NOUN IS predicate`` left to right from ``(x, y)``; returns the three cells.
        ``overwrite``: first remove whatever lies there; ``stack``: lay the words over the words
        there (which stay under them)."""
        cells = [(x, y), (x + 1, y), (x + 2, y)]
        for cell, kind in zip(cells, (noun_word(noun), IS, predicate)):
            if overwrite:
                self.objects.pop(cell, None)
            if stack and cell in self.words:
                self.covered.append((cell, self.words[cell]))
            self.words[cell] = kind
        return cells

    def move_word(self, src: tuple[int, int], dest: Area | tuple[int, int], overwrite: bool = False) -> None:
        """Move the word block at ``src`` to a random free cell of an area ``(x0, y0, x1, y1)``,
        or to the cell ``(x, y)`` (``overwrite``: removing what lies there); breaks its rule."""
        kind = self.words.pop(src)
        cell = self.random_free(dest) if len(dest) == 4 else dest
        if overwrite:
            self.objects.pop(cell, None)
        self.words[cell] = kind  # type: ignore[index]

    def place_object(self, name: str, area: Area) -> tuple[int, int]:
        cell = self.random_free(area)
        self.objects[cell] = object_kind(name)
        return cell

    def state(self) -> GameState:
        covered = [(k, x, y) for (x, y), k in self.covered]  # first: a later word lies on top
        return GameState.build(
            self.width,
            self.height,
            [*covered, *((k, x, y) for (x, y), k in sorted(self.words.items(), key=lambda i: i[0][::-1]))],
            ((k, x, y) for (x, y), k in self.objects.items()),
        )


class _Redraw(Exception):
    """A draw this engine cannot represent: draw again from the same stream."""


def _three_names(rng: random.Random) -> tuple[str, str, str]:
    """The WIN object's type, the distractor's, and a third one absent from the level."""
    first, second, third = rng.sample(GOAL_OBJECTS, 3)
    return first, second, third


def _single_room(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
    lay = _Layout(8, 8, rng)
    win_obj, other, absent = _three_names(rng)
    lay.put_rule("baba", property_word("you"), 1, 6)  # against the bottom-left border
    win_cells = lay.put_rule(win_obj, property_word("win"), 1, 1)  # against the top-left border
    if cfg.break_win:
        lay.move_word(win_cells[0], (2, 2, 5, 5))
    if cfg.distractor_rule:
        # cells from which the noun can be pushed only along the border: never into a WIN rule
        # (the benchmark's list, (6, 1) and (6, 6) included twice)
        edge = [(4, 6), (5, 6), (6, 6), (4, 1), (5, 1), (6, 1)] + [(6, y) for y in range(1, 7)]
        lay.words[rng.choice(edge)] = noun_word(absent if cfg.irrelevant_rule else other)
    room = (1, 2, 6, 6)
    lay.place_object("baba", room)
    lay.place_object(win_obj, room)
    if cfg.distractor_obj:
        lay.place_object(other, room)
    plan = f"make[{win_obj} is win], goto[{win_obj}]" if cfg.break_win else f"goto[{win_obj}]"
    return Level(task, lay.state(), win_obj, other if cfg.distractor_obj else None, plan)


_WIDTH, _HEIGHT, _MID = 13, 9, 6  # the two-room levels: 13x9 with the border, walls at x = 6
#: cells along the right room's border, where a noun can never reach a WIN rule
_RIGHT_EDGE: tuple[tuple[int, int], ...] = (
    *((_WIDTH - 2, 2 + i) for i in range(_HEIGHT - 4)),
    *((_WIDTH - 2 - i, _HEIGHT - 2) for i in range(_MID - 2)),
)
_TWO_ROOM_AREAS: dict[str, Area] = {
    "left_pushable": (2, 3, _MID - 1, _HEIGHT - 4),  # room to push a word in any direction
    "right_pushable": (_MID + 1, 3, _WIDTH - 3, _HEIGHT - 4),
    "left": (1, 1, _MID - 2, _HEIGHT - 2),
    "right": (_MID + 1, 2, _WIDTH - 3, _HEIGHT - 2),
    "anywhere": (1, 2, _WIDTH - 2, _HEIGHT - 2),
}
#: the make-you and make-wall-win levels keep their words one cell further from the divider
_NARROW_AREAS: dict[str, Area] = {
    **_TWO_ROOM_AREAS,
    "left_pushable": (2, 3, _MID - 2, _HEIGHT - 4),
    "right_pushable": (_MID + 2, 3, _WIDTH - 3, _HEIGHT - 4),
}


def _two_room_layout(rng: random.Random) -> _Layout:
    lay = _Layout(_WIDTH, _HEIGHT, rng)
    for y in range(1, _HEIGHT - 1):
        lay.objects[(_MID, y)] = object_kind("wall")
    return lay


def _two_room(task: str, cfg: TaskConfig, rng: random.Random, stack_words: bool = False) -> Level:
    areas = _TWO_ROOM_AREAS
    lay = _two_room_layout(rng)
    win_obj, other, absent = _three_names(rng)
    lay.put_rule("baba", property_word("you"), 1, _HEIGHT - 2)  # unbreakable: bottom-left corner
    stop_cells = lay.put_rule("wall", property_word("stop"), 1, 2)
    win_cells = lay.put_rule(win_obj, property_word("win"), _WIDTH - 4, 1)  # top-right corner
    if cfg.distractor_rule:
        if cfg.irrelevant_rule:
            lay.words[lay.random_free(areas["right_pushable"])] = noun_word(absent)
        elif cfg.distractor_obj:  # along the right room's border: it can never make a WIN rule
            lay.words[rng.choice(_RIGHT_EDGE)] = noun_word(other)
        else:
            lay.words[lay.random_free(areas["right_pushable"])] = noun_word(other)
    if cfg.stop_broken:
        lay.move_word(rng.choice(stop_cells[1:]), areas["left_pushable"])
    if cfg.break_win:
        lay.move_word(win_cells[0], areas["right_pushable"])
    lay.place_object("baba", areas["left_pushable"])
    win_x, _ = lay.place_object(win_obj, areas[cfg.win_area])
    if cfg.distractor_obj:
        lay.place_object(other, areas[cfg.win_area])
    if cfg.distractor_win_rule:
        # the benchmark lays this rule over whatever word lies there (revealed once pushed away):
        # stacked as it does, or the draw redrawn (see the module docstring)
        cells = [(_WIDTH - 4 + i, 4) for i in range(3)]
        if not stack_words and any(c in lay.words for c in cells):
            raise _Redraw
        lay.put_rule(absent, property_word("win"), _WIDTH - 4, 4, overwrite=True, stack=stack_words)
    steps = []
    if win_x > _MID and not cfg.stop_broken:
        steps.append("break[wall is stop]")
    if cfg.break_win:
        steps.append(f"make[{win_obj} is win]")
    steps.append(f"goto[{win_obj}]")
    distractor = other if cfg.distractor_obj else None
    return Level(task, lay.state(), win_obj, distractor, ", ".join(steps))


def _make_you(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
    """Baba cannot cross the walls; the distractor's noun lies in Baba's room: make the distractor
    YOU (it stands in the right room with the WIN object), and remake the WIN rule if broken."""
    areas = _NARROW_AREAS
    lay = _two_room_layout(rng)
    win_obj, other, _ = _three_names(rng)
    lay.put_rule("baba", property_word("you"), 1, _HEIGHT - 3)
    lay.put_rule("wall", property_word("stop"), 1, 1)
    win_cells = lay.put_rule(win_obj, property_word("win"), _WIDTH - 4, 1)
    lay.words[lay.random_free(areas["left_pushable"])] = noun_word(other)
    if cfg.break_win:
        lay.move_word(win_cells[0], areas["right_pushable"])
    lay.place_object("baba", areas["left_pushable"])
    lay.place_object(win_obj, areas["right"])
    lay.place_object(other, areas["right"])
    plan = f"make[{other} is you], " + (f"make[{win_obj} is win], " if cfg.break_win else "") + f"goto[{win_obj}]"
    return Level(task, lay.state(), win_obj, other, plan)


def _make_wall_win(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
    """The WIN rule's noun is stuck along the right room's border: take WALL out of WALL IS STOP
    (which also opens the walls), make WALL IS WIN with it and walk onto a wall."""
    areas = _NARROW_AREAS
    lay = _two_room_layout(rng)
    win_obj, other, absent = _three_names(rng)
    lay.put_rule("baba", property_word("you"), 1, _HEIGHT - 2)
    lay.put_rule("wall", property_word("stop"), 2, 2)
    win_cells = lay.put_rule(win_obj, property_word("win"), _WIDTH - 4, 1)
    lay.words[lay.random_free(areas["right_pushable"])] = noun_word(absent)
    lay.move_word(win_cells[0], rng.choice(_RIGHT_EDGE), overwrite=True)
    lay.place_object("baba", areas["left_pushable"])
    lay.place_object(win_obj, areas["right"])
    lay.place_object(other, areas["right"])
    return Level(task, lay.state(), "wall", other, "break[wall is stop], make[wall is win], goto[wall]")


_BUILDERS: dict[str, Callable[[str, TaskConfig, random.Random], Level]] = {
    "one_room": _single_room,
    "two_room": _two_room,
    "make_you": _make_you,
    "make_wall_win": _make_wall_win,
}


def generate(
    task: str,
    rng: random.Random,
    max_steps: int = 100,
    ensure_solvable: bool = True,
    solver: Callable[[GameState, int], list[str] | None] | None = None,
    win_rule: str = "current",
    stack_words: bool = False,
) -> Level:
    """Draw a level of ``task`` from ``rng``; with ``ensure_solvable``, redraw until the BFS
    solver finds a win within ``max_steps`` moves under ``win_rule`` (deterministic given the
    rng's state). ``stack_words``: lay the extra WIN rule of the ``*-distr_win_rule`` tasks over
    the words there, as the original does, instead of redrawing such a draw."""
    cfg = TASK_CONFIGS.get(task)
    if cfg is None:
        raise ValueError(f"unknown BabaIsAI task {task!r}; valid tasks: {', '.join(TASKS)}")
    layout = _BUILDERS[cfg.layout]
    if cfg.layout == "two_room":
        layout = functools.partial(_two_room, stack_words=stack_words)

    def build(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
        for _ in range(1000):
            try:
                return layout(task, cfg, rng)
            except _Redraw:
                continue
        raise RuntimeError(f"could not draw a {task} level")

    if not ensure_solvable:
        return build(task, cfg, rng)
    if solver is None:
        from .solver import BOT_MAX_STATES, solve

        def solver(state: GameState, depth: int) -> list[str] | None:
            # a level the search cannot win within the bot's budget is redrawn too (proving a level
            # unsolvable takes minutes; such levels are rare and always the unsolvable ones seen)
            return solve(state, depth, max_states=BOT_MAX_STATES, win_rule=win_rule)

    for attempt in range(100):
        level = build(task, cfg, rng)
        if solver(level.state, max_steps) is not None:
            return dataclasses.replace(level, redraws=attempt)
    raise RuntimeError(f"could not draw a solvable {task} level in 100 tries")
