"""Sokoban as a text environment: verl-agent's rooms, moves, rewards, text view and step cap.

The model reads the room as verl-agent's text view (one row a line, `` # \\t`` cells; symbols in
the instruction) and answers with reasoning and ``ACTION: up`` (or ``down``/``left``/``right``),
matched tolerantly like every verlog game. An answer naming no move runs verl-agent's no-op
(``still``: nothing moves, the game pays nothing) and costs ``invalid_action_penalty`` (0.1, the
coefficient of verl-agent's Sokoban runs); it still uses up one of the ``max_steps`` turns (15, as
verl-agent's runs). Rewards are gym-sokoban's (:mod:`.game`): -0.1 a move, +1/-1 for a box pushed
onto/off a target, +10 when every box is on one, which ends the episode as a win.

Levels: episode seed ``s`` plays the room :func:`.generator.generate` draws from ``s`` (6x6, one
box, 30 reverse moves by default), redrawn until its shortest solution fits in ``max_steps``.
verl-agent trains on seeds below ``2**16`` and validates on seeds from ``2**16`` up
(:data:`TRAIN_SEEDS`, :data:`HELD_OUT_SEED_START`). Small rooms repeat themselves across seeds, so
the split is also by content (:mod:`verlog.envs.held_out`): a quarter of the room contents (walls,
targets, boxes) are drawn by held-out seeds only, the rest by training seeds only.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.base import EpisodeSeeds, StepResult, TextEnv
from verlog.envs.held_out import HELD_OUT_SHARE, draw_level
from verlog.envs.progression import goal_value
from verlog.step_info import step_info

from . import game
from .game import ACTIONS, NO_OP, SYMBOLS, Room, State
from .generator import DIM_ROOM, NUM_BOXES, SEARCH_DEPTH, Level, generate

#: verl-agent's step cap for Sokoban (``env.max_steps`` of its Sokoban runs)
MAX_STEPS = 15
#: verl-agent's training seeds (drawn from ``[0, 2**16 - 1)``) and where its validation seeds start
TRAIN_SEEDS = range(0, 2**16 - 1)
HELD_OUT_SEED_START = 2**16

#: extra phrasings accepted for each move (matching is case- and punctuation-insensitive)
SYNONYMS: dict[str, str] = {
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
    **{f"{verb} {a}": a for verb in ("move", "go", "push", "step", "walk") for a in ACTIONS},
}

_ACTION_HELP = {
    "up": "move one cell up (pushing a box there up)",
    "down": "move one cell down (pushing a box there down)",
    "left": "move one cell left (pushing a box there left)",
    "right": "move one cell right (pushing a box there right)",
}

_SYMBOL_HELP = (
    ("wall", "a wall: nothing passes through it"),
    ("floor", "empty floor"),
    ("target", "a target: a spot a box must end on"),
    ("box", "a box"),
    ("box_on_target", "a box already on a target"),
    ("player", "you"),
    ("player_on_target", "you, standing on a target"),
)


def level_content(level: Level) -> str:
    """What defines a room's puzzle, the player's start left out: its size, walls, targets and boxes."""
    room = level.room
    return f"{room.height}x{room.width} walls {sorted(room.walls)} targets {sorted(room.targets)} boxes {sorted(level.state.boxes)}"


def _check_setting(name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"Sokoban setting {name}={value!r} is invalid; allowed: {allowed}")


class SokobanEnv(TextEnv):
    """Sokoban as a :class:`TextEnv` (see the module docstring).

    ``seed``: the first :meth:`reset` without a seed plays this seed's room; later ones draw seeds
    from a stream derived from it. ``dim_room`` ``(height, width)``, ``num_boxes`` and
    ``search_depth``: the generator's settings; ``search_depth`` may be a range ``[low, high]``:
    each room's depth is then drawn uniformly from it by the room's seed (rooms of mixed
    difficulty: depth 1-4 rooms are 1-2 moves from solved, depth 12 and above as hard as
    verl-agent's 30). ``max_steps``: turns before the episode is truncated.
    ``invalid_action_penalty``: subtracted from a turn whose answer named no move.
    ``held_out_share``: the share of room contents (walls, targets and boxes) that only the held-out
    seeds (from :data:`HELD_OUT_SEED_START`) draw, the others only the training seeds
    (:mod:`verlog.envs.held_out`); 0 splits by seed alone, as verl-agent does.
    """

    name = "sokoban"
    actions = ACTIONS
    action_help = _ACTION_HELP

    def __init__(
        self,
        seed: int | None = None,
        dim_room: tuple[int, int] | list[int] = DIM_ROOM,
        num_boxes: int = NUM_BOXES,
        max_steps: int = MAX_STEPS,
        search_depth: int | tuple[int, int] | list[int] = SEARCH_DEPTH,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        held_out_share: float = HELD_OUT_SHARE,
    ) -> None:
        dims = tuple(dim_room) if isinstance(dim_room, (tuple, list)) else ()
        _check_setting(
            "dim_room",
            dim_room,
            len(dims) == 2 and all(isinstance(d, int) and d >= 4 for d in dims),
            "two integers (height, width), each at least 4",
        )
        _check_setting("num_boxes", num_boxes, isinstance(num_boxes, int) and 1 <= num_boxes <= 4, "an integer 1-4")
        _check_setting("max_steps", max_steps, isinstance(max_steps, int) and max_steps >= 1, "an integer >= 1")
        depths = list(search_depth) if isinstance(search_depth, (tuple, list)) else [search_depth]
        _check_setting(
            "search_depth",
            search_depth,
            len(depths) in (1, 2)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in depths)
            and depths == sorted(depths)
            and (len(depths) == 2 or not isinstance(search_depth, (tuple, list))),
            "an integer >= 1, or a range [low, high] of them (each room's depth drawn from it)",
        )
        _check_setting(
            "held_out_share",
            held_out_share,
            isinstance(held_out_share, (int, float)) and 0 <= held_out_share < 1,
            "a number in [0, 1): the share of room contents kept for the held-out seeds (0: seeds only)",
        )
        self.held_out_share = float(held_out_share)
        self.dim_room: tuple[int, int] = (int(dims[0]), int(dims[1]))
        self.num_boxes = num_boxes
        self.max_steps = max_steps
        #: one depth, or the range ``(low, high)`` each room's depth is drawn from
        self.search_depth: int | tuple[int, int] = (
            search_depth if isinstance(search_depth, int) else (depths[0], depths[1])
        )
        self.invalid_action_penalty = invalid_action_penalty
        self._seeds = EpisodeSeeds(seed)
        self.seed: int | None = None
        self.level: Level | None = None
        self._state: State | None = None
        self.steps_taken = 0
        self.done = False
        self.won = False

    # -- episode ---------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> str:
        self.seed = seed = self._seeds.next(seed)
        self.level = draw_level(
            seed,
            held_out=seed >= HELD_OUT_SEED_START,
            share=self.held_out_share,
            draw=self._generate,
            content_of=level_content,
        )
        return self._start(self.level.state)

    def _generate(self, seed: int) -> Level:
        rng = random.Random(seed)
        depth = self.search_depth if isinstance(self.search_depth, int) else rng.randint(*self.search_depth)
        return generate(rng, self.dim_room, self.num_boxes, depth, self.max_steps)

    def reset_to(self, room: Room, state: State) -> str:
        """Start an episode from a given level (hand-made puzzles, tests); returns its observation."""
        self.seed = None
        self.level = Level(room, state, ())
        return self._start(state)

    def _start(self, state: State) -> str:
        self._state = state
        self.steps_taken = 0
        self.done = False
        self.won = False
        return self.observation()

    def step(self, action_text: str) -> StepResult:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        chosen = parse_action(action_text, ACTIONS, SYNONYMS).action
        valid = chosen is not None
        action = chosen or NO_OP
        outcome = game.step(self.room, self._state, action)
        self._state = outcome.state
        self.steps_taken += 1
        reward = outcome.reward - (0.0 if valid else self.invalid_action_penalty)
        terminated = outcome.solved
        truncated = not terminated and self.steps_taken >= self.max_steps
        self.won = outcome.solved
        self.done = terminated or truncated
        info = step_info(
            action,
            valid,
            self.steps_taken,
            done=self.done,
            success=outcome.solved,
            won=outcome.solved,
            moved=outcome.moved,
            boxes_on_target=game.boxes_on_target(self.room, self._state),
            progression=goal_value(outcome.solved),
        )
        return StepResult(self.observation(), reward, terminated, truncated, info)

    # -- views -----------------------------------------------------------------------------

    @property
    def room(self) -> Room:
        """The fixed part of the current level."""
        if self.level is None:
            raise RuntimeError("call reset() first")
        return self.level.room

    @property
    def state(self) -> State:
        """The current positions (read them to plan; change them only through :meth:`step`)."""
        if self._state is None:
            raise RuntimeError("call reset() first")
        return self._state

    def observation(self) -> str:
        """The text the model sees: verl-agent's text view of the room."""
        return game.render_text(self.room, self.state)

    def image(self) -> np.ndarray:
        """The RGB view of the current state (``uint8``, 16 pixels a cell)."""
        return game.render_rgb(self.room, self.state)

    def render(self) -> str:
        """A compact drawing of the room (one symbol a cell), for ``verlog play`` and debugging."""
        return game.render_grid(self.room, self.state)

    @property
    def instruction(self) -> str:
        symbols = "\n".join(f"- {SYMBOLS[kind]}: {text}" for kind, text in _SYMBOL_HELP)
        return (
            "You are playing Sokoban in a small room seen from above.\n\n"
            f"The room is shown one row per line, one symbol per cell:\n{symbols}\n\n"
            "Goal: push every box onto a target. You push a box by walking into it; it moves one "
            "cell the same way if the cell behind it is free (not a wall, not another box). You "
            "cannot pull a box, so a box pushed into a corner or along a wall may be stuck for good. "
            "Each move costs 0.1; a box pushed onto a target earns 1 (pushed off one, -1), and "
            f"placing the last box earns 10 and wins. You have {self.max_steps} moves.\n\n"
            f"Valid actions:\n{self.actions_text()}\n\n{ANSWER_FORMAT}"
        )
