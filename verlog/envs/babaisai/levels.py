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
same random stream if unsolvable, so each seed gives one fixed, solvable level.
"""

from __future__ import annotations

import dataclasses
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

    two_room: bool
    break_win: bool = False  # the WIN rule starts broken (make_win)
    stop_broken: bool = False  # two rooms: WALL IS STOP starts broken
    win_area: str = "room"  # where the WIN object goes: room / left / right / anywhere
    distractor_obj: bool = False
    distractor_rule: bool = False


TASK_CONFIGS: dict[str, TaskConfig] = {
    "goto_win": TaskConfig(two_room=False),
    "goto_win-distr_obj": TaskConfig(two_room=False, distractor_obj=True),
    "goto_win-distr_rule": TaskConfig(two_room=False, distractor_rule=True),
    "goto_win-distr_obj_rule": TaskConfig(
        two_room=False, distractor_obj=True, distractor_rule=True
    ),
    "make_win": TaskConfig(two_room=False, break_win=True),
    "make_win-distr_obj": TaskConfig(two_room=False, break_win=True, distractor_obj=True),
    "make_win-distr_obj_rule": TaskConfig(
        two_room=False, break_win=True, distractor_obj=True, distractor_rule=True
    ),
    "two_room-goto_win": TaskConfig(two_room=True, stop_broken=True, win_area="left"),
    "two_room-goto_win-distr_obj": TaskConfig(
        two_room=True, stop_broken=True, win_area="left", distractor_obj=True
    ),
    "two_room-goto_win-distr_obj_rule": TaskConfig(
        two_room=True, stop_broken=True, win_area="left", distractor_obj=True, distractor_rule=True
    ),
    "two_room-break_stop-goto_win": TaskConfig(two_room=True, win_area="right"),
    "two_room-maybe_break_stop-goto_win": TaskConfig(two_room=True, win_area="anywhere"),
    "two_room-maybe_break_stop-goto_win-distr_obj_rule": TaskConfig(
        two_room=True, win_area="anywhere", distractor_obj=True, distractor_rule=True
    ),
}
# ``two_room-make_win`` (cross to the right room, repair the WIN rule, come back) fits the
# generator (``TaskConfig(two_room=True, break_win=True, stop_broken=True, win_area="left")``)
# but is left out: proving each level solvable takes the pure-Python BFS ~8 s (~300k states).

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

    def free(self, x: int, y: int) -> bool:
        return (x, y) not in self.words and (x, y) not in self.objects

    def random_free(self, area: Area) -> tuple[int, int]:
        x0, y0, x1, y1 = area
        cells = [(x, y) for y in range(y0, y1 + 1) for x in range(x0, x1 + 1) if self.free(x, y)]
        if not cells:
            raise RuntimeError(f"no free cell in {area}")
        return self.rng.choice(cells)

    def put_rule(self, noun: str, predicate: int, x: int, y: int) -> list[tuple[int, int]]:
        """Lay ``NOUN IS predicate`` left to right from ``(x, y)``; returns the three cells."""
        cells = [(x, y), (x + 1, y), (x + 2, y)]
        for cell, kind in zip(cells, (noun_word(noun), IS, predicate)):
            self.words[cell] = kind
        return cells

    def move_word(self, src: tuple[int, int], area: Area) -> None:
        """Move the word block at ``src`` to a random free cell of ``area`` (breaking its rule)."""
        kind = self.words.pop(src)
        dest = self.random_free(area)
        self.words[dest] = kind

    def place_object(self, name: str, area: Area) -> tuple[int, int]:
        cell = self.random_free(area)
        self.objects[cell] = object_kind(name)
        return cell

    def state(self) -> GameState:
        return GameState.build(
            self.width,
            self.height,
            ((k, x, y) for (x, y), k in sorted(self.words.items(), key=lambda i: i[0][::-1])),
            ((k, x, y) for (x, y), k in self.objects.items()),
        )


def _single_room(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
    lay = _Layout(8, 8, rng)
    win_obj, other = rng.sample(GOAL_OBJECTS, 2)
    lay.put_rule("baba", property_word("you"), 1, 6)  # against the bottom-left border
    win_cells = lay.put_rule(win_obj, property_word("win"), 1, 1)  # against the top-left border
    if cfg.break_win:
        lay.move_word(win_cells[0], (2, 2, 5, 5))
    if cfg.distractor_rule:
        # cells from which the noun can be pushed only along the border: never into a WIN rule
        edge = [(4, 6), (5, 6), (6, 6), (4, 1), (5, 1), (6, 1)] + [(6, y) for y in range(2, 6)]
        lay.words[rng.choice([c for c in edge if lay.free(*c)])] = noun_word(other)
    room = (1, 2, 6, 6)
    lay.place_object("baba", room)
    lay.place_object(win_obj, room)
    if cfg.distractor_obj:
        lay.place_object(other, room)
    plan = f"make[{win_obj} is win], goto[{win_obj}]" if cfg.break_win else f"goto[{win_obj}]"
    return Level(task, lay.state(), win_obj, other if cfg.distractor_obj else None, plan)


def _two_room(task: str, cfg: TaskConfig, rng: random.Random) -> Level:
    width, height = 13, 9
    mid = width // 2
    lay = _Layout(width, height, rng)
    for y in range(1, height - 1):
        lay.objects[(mid, y)] = object_kind("wall")
    win_obj, other = rng.sample(GOAL_OBJECTS, 2)
    areas: dict[str, Area] = {
        "left_pushable": (2, 3, mid - 1, height - 4),  # room to push a word in any direction
        "right_pushable": (mid + 1, 3, width - 3, height - 4),
        "left": (1, 1, mid - 2, height - 2),
        "right": (mid + 1, 2, width - 3, height - 2),
        "anywhere": (1, 2, width - 2, height - 2),
    }
    lay.put_rule("baba", property_word("you"), 1, height - 2)  # unbreakable: bottom-left corner
    stop_cells = lay.put_rule("wall", property_word("stop"), 1, 2)
    win_cells = lay.put_rule(win_obj, property_word("win"), width - 4, 1)  # top-right corner
    if cfg.distractor_rule:
        if cfg.distractor_obj:
            # along the right room's border: this noun can never reach the WIN rule
            edge = [(width - 2, y) for y in range(2, height - 2)]
            edge += [(width - 2 - i, height - 2) for i in range(mid - 2)]
            lay.words[rng.choice([c for c in edge if lay.free(*c)])] = noun_word(other)
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
    steps = []
    if win_x > mid and not cfg.stop_broken:
        steps.append("break[wall is stop]")
    if cfg.break_win:
        steps.append(f"make[{win_obj} is win]")
    steps.append(f"goto[{win_obj}]")
    distractor = other if cfg.distractor_obj else None
    return Level(task, lay.state(), win_obj, distractor, ", ".join(steps))


def generate(
    task: str,
    rng: random.Random,
    max_steps: int = 100,
    ensure_solvable: bool = True,
    solver: Callable[[GameState, int], list[str] | None] | None = None,
) -> Level:
    """Draw a level of ``task`` from ``rng``; with ``ensure_solvable``, redraw until the BFS
    solver finds a win within ``max_steps`` moves (deterministic given the rng's state)."""
    cfg = TASK_CONFIGS.get(task)
    if cfg is None:
        raise ValueError(f"unknown BabaIsAI task {task!r}; valid tasks: {', '.join(TASKS)}")
    build = _two_room if cfg.two_room else _single_room
    if not ensure_solvable:
        return build(task, cfg, rng)
    if solver is None:
        from .solver import solve as solver
    for attempt in range(100):
        level = build(task, cfg, rng)
        if solver(level.state, max_steps) is not None:
            return dataclasses.replace(level, redraws=attempt)
    raise RuntimeError(f"could not draw a solvable {task} level in 100 tries")
