"""Sokoban's rules: a room, the moves, the rewards, and the two views of a state (text, RGB image).

The settings follow verl-agent's Sokoban (``agent_system/environments/env_package/sokoban``),
which plays gym-sokoban's push-or-move actions with gym-sokoban's rewards:

* actions ``up``/``down``/``left``/``right`` (verl-agent's ids 1-4; id 0, ``still``, is what an
  unparsable answer runs: nothing moves and the game pays nothing);
* a move walks onto free floor or a target, or pushes the box in front one cell when the cell
  behind it is free; anything else leaves the state unchanged (the step still costs);
* every step costs :data:`STEP_PENALTY`; a push onto a target pays :data:`BOX_ON_TARGET`, a push off
  one :data:`BOX_OFF_TARGET`; putting the last box on its target adds :data:`FINISHED`;
* the text view is one row per line, each cell `` X \\t`` with the symbols of :data:`SYMBOLS`.

Coordinates are ``(row, column)``, row 0 at the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

#: the moves, in verl-agent's id order (1 up, 2 down, 3 left, 4 right)
ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
#: what an answer naming no move runs (verl-agent's action 0): the state stays as it is
NO_OP = "still"
#: verl-agent's action ids
ACTION_IDS: dict[str, int] = {NO_OP: 0, **{name: i + 1 for i, name in enumerate(ACTIONS)}}
#: the (row, column) change of each move
DELTAS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

#: gym-sokoban's rewards, as verl-agent plays them
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
FINISHED = 10.0

#: the text symbol of each kind of cell (verl-agent's grid lookup)
SYMBOLS: dict[str, str] = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box_on_target": "√",
    "box": "X",
    "player": "P",
    "player_on_target": "S",
}

#: the colour of each kind of cell in the RGB view, and its size in pixels
COLOURS: dict[str, tuple[int, int, int]] = {
    "wall": (112, 84, 62),
    "floor": (0, 0, 0),
    "target": (200, 40, 40),
    "box": (230, 190, 40),
    "box_on_target": (120, 200, 60),
    "player": (80, 200, 120),
}
CELL_PIXELS = 16

Cell = tuple[int, int]


@dataclass(frozen=True)
class Room:
    """The fixed part of a level: its size, walls and targets."""

    height: int
    width: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]

    def free(self, cell: Cell) -> bool:
        """Whether ``cell`` is inside the room and not a wall."""
        r, c = cell
        return 0 <= r < self.height and 0 <= c < self.width and cell not in self.walls

    def floor(self) -> list[Cell]:
        """Every walkable cell (floor or target), row by row."""
        return [(r, c) for r in range(self.height) for c in range(self.width) if (r, c) not in self.walls]


@dataclass(frozen=True)
class State:
    """The moving part of a level: where the player and the boxes are (``boxes`` sorted)."""

    player: Cell
    boxes: tuple[Cell, ...]

    @classmethod
    def of(cls, player: Cell, boxes: set[Cell] | frozenset[Cell]) -> "State":
        """The state with the player at ``player`` and boxes at ``boxes`` (kept sorted)."""
        return cls(player, tuple(sorted(boxes)))


@dataclass(frozen=True)
class Outcome:
    """What one move did: the new state, its reward and whether every box is on a target."""

    state: State
    reward: float
    solved: bool
    moved: bool


def boxes_on_target(room: Room, state: State) -> int:
    """How many boxes stand on a target."""
    return sum(box in room.targets for box in state.boxes)


def is_solved(room: Room, state: State) -> bool:
    """Whether every box stands on a target."""
    return boxes_on_target(room, state) == len(state.boxes)


def move(room: Room, state: State, action: str) -> tuple[State, bool]:
    """The state after ``action`` (a name of :data:`ACTIONS` or :data:`NO_OP`) and whether the
    player moved."""
    if action == NO_OP:
        return state, False
    dr, dc = DELTAS[action]
    r, c = state.player
    ahead = (r + dr, c + dc)
    if not room.free(ahead):
        return state, False
    boxes = set(state.boxes)
    if ahead in boxes:
        beyond = (ahead[0] + dr, ahead[1] + dc)
        if not room.free(beyond) or beyond in boxes:
            return state, False
        boxes.remove(ahead)
        boxes.add(beyond)
    return State.of(ahead, boxes), True


def step(room: Room, state: State, action: str) -> Outcome:
    """One move with gym-sokoban's reward (:data:`NO_OP` pays nothing: verl-agent's action 0)."""
    after, moved = move(room, state, action)
    if action == NO_OP:
        return Outcome(after, 0.0, is_solved(room, after), False)
    before_on, after_on = boxes_on_target(room, state), boxes_on_target(room, after)
    reward = STEP_PENALTY
    if after_on > before_on:
        reward += BOX_ON_TARGET
    elif after_on < before_on:
        reward += BOX_OFF_TARGET
    solved = after_on == len(after.boxes)
    if solved:
        reward += FINISHED
    return Outcome(after, reward, solved, moved)


def cell_kinds(room: Room, state: State) -> Iterator[list[str]]:
    """The kind of every cell (a key of :data:`SYMBOLS`), row by row."""
    boxes = set(state.boxes)
    for r in range(room.height):
        row = []
        for c in range(room.width):
            cell = (r, c)
            on_target = cell in room.targets
            if cell in room.walls:
                row.append("wall")
            elif cell in boxes:
                row.append("box_on_target" if on_target else "box")
            elif cell == state.player:
                row.append("player_on_target" if on_target else "player")
            else:
                row.append("target" if on_target else "floor")
        yield row


def render_text(room: Room, state: State) -> str:
    """verl-agent's text view: one line per row, each cell its symbol padded as `` X \\t``."""
    return "\n".join("".join(f" {SYMBOLS[kind]} \t" for kind in row) for row in cell_kinds(room, state))


def render_grid(room: Room, state: State) -> str:
    """A compact drawing (one symbol per cell), for people and tests."""
    return "\n".join("".join(SYMBOLS[kind] for kind in row) for row in cell_kinds(room, state))


def render_rgb(room: Room, state: State, cell_pixels: int = CELL_PIXELS) -> np.ndarray:
    """The RGB view: ``(height*cell_pixels, width*cell_pixels, 3)`` ``uint8``, one flat tile per
    cell (a target shows as a red frame under whatever stands on it, the player as a green
    square)."""
    p = cell_pixels
    image = np.zeros((room.height * p, room.width * p, 3), dtype=np.uint8)
    inset = max(1, p // 4)
    for r, row in enumerate(cell_kinds(room, state)):
        for c, kind in enumerate(row):
            tile = image[r * p : (r + 1) * p, c * p : (c + 1) * p]
            if kind == "wall":
                tile[:] = COLOURS["wall"]
                continue
            if (r, c) in room.targets:
                tile[:] = COLOURS["target"]
                tile[inset // 2 : p - inset // 2, inset // 2 : p - inset // 2] = COLOURS["floor"]
            if kind in ("box", "box_on_target"):
                tile[inset // 2 : p - inset // 2, inset // 2 : p - inset // 2] = COLOURS[kind]
            elif kind in ("player", "player_on_target"):
                tile[inset : p - inset, inset : p - inset] = COLOURS["player"]
    return image


def parse_grid(text: str) -> tuple[Room, State]:
    """A level from a compact drawing (:func:`render_grid`'s symbols; every row the same length):
    for hand-made puzzles and tests. Raises ``ValueError`` on an unknown symbol or a level without
    exactly one player or with fewer targets than boxes."""
    rows = text.strip("\n").splitlines()
    kinds = {symbol: kind for kind, symbol in SYMBOLS.items()}
    walls, targets, boxes, players = set(), set(), set(), []
    width = max(len(row) for row in rows)
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row.ljust(width, SYMBOLS["wall"])):
            kind = kinds.get(symbol)
            if kind is None:
                valid = "".join(SYMBOLS.values())
                raise ValueError(f"unknown Sokoban symbol {symbol!r} at row {r}, column {c}; valid: {valid}")
            if kind == "wall":
                walls.add((r, c))
            if kind in ("target", "box_on_target", "player_on_target"):
                targets.add((r, c))
            if kind in ("box", "box_on_target"):
                boxes.add((r, c))
            if kind in ("player", "player_on_target"):
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"a Sokoban level needs exactly one player (found {len(players)})")
    if not boxes or len(targets) < len(boxes):
        raise ValueError(
            f"a Sokoban level needs at least one box and a target per box (boxes {len(boxes)}, targets {len(targets)})"
        )
    room = Room(len(rows), width, frozenset(walls), frozenset(targets))
    return room, State(players[0], tuple(sorted(boxes)))
