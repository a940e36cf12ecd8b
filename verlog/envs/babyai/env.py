"""BabyAI (on ``minigrid``) played in text.

Five task families, BALROG's BabyAI tasks (the first four are also in Verlog's results tables):

``goto``
    "go to the red ball": end facing the object, one step away.
``pickup``
    "pick up a blue key".
``pick_up_seq_go_to``
    "pick up the grey box, then go to a red ball" (or "go to ... after you pick up ...").
``open``
    "open the yellow door": the door is locked, so the agent first fetches the key of its colour.
``putnext``
    "put the red ball next to the blue key".

Two protocols (``protocol=``):

``"verlog"`` (default): verlog's training variant
    ``layout="local"``: one 8x8 room holding 9 objects (10 for ``pick_up_seq_go_to`` and
    ``putnext``); for ``open`` two rooms joined by the locked door, the key and 8 other objects in
    the agent's room; a 128-step cap. ``layout="maze"``: the registered 3x3-room levels
    (``BabyAI-GoTo-v0`` ...), minigrid's own caps. The observation lists what the agent sees
    ("a red ball 2 steps forward and 1 step left"), what is directly in front and what it carries,
    under the mission; the instruction explains the actions and the answer format (reasoning, then
    ``ACTION: <action>``, matched tolerantly). An answer naming no valid action runs a *no-op*
    (``default_action`` can name a real action instead) and costs ``invalid_action_penalty``.
``"balrog"``: BALROG's levels, text and rules (BabyAI-Text's ``BabyAI-MixedTrainLocal-v0``
    restricted to one mission kind, with BALROG's ``num_dists: 0``)
    ``goto`` and ``pickup``: one 8x8 room with one object; ``putnext`` and ``pick_up_seq_go_to``:
    two objects; ``open``: two rooms, the locked door between them (yellow, green, blue or purple),
    its key in the agent's room and nothing else. Missions naming a yellow box, a red key, a red
    door, a green ball or a grey door are redrawn (BabyAI-Text keeps those for its test levels).
    Caps are the level's own: 64 steps (one room, one navigation) per navigation the mission needs
    times the rooms, so ``goto``/``pickup`` 64 and ``open``/``putnext``/``pick_up_seq_go_to`` 128.
    The observation is BabyAI-Text's description list, one line each: "You carry a red ball" when
    carrying, the nearest wall straight ahead, to the left and to the right when nothing stands in
    between ("a wall 4 steps forward"), then every object in view column by column (left to right,
    far to near) as "a red ball 1 step left and 2 steps forward" (doors as "a locked red door ...";
    an open door reads "a open ..." as in BabyAI-Text). An answer is valid only if it *is* an action
    name (:mod:`verlog.envs.balrog_protocol`); otherwise "go forward" runs. No penalty.

The image of an observation (BALROG's vision protocol, :meth:`BabyAITextEnv.observation_image`)
is the agent's view as minigrid draws it, 16 pixels a cell (112x112).

Reward is binary: 1 when the mission is accomplished (not minigrid's time-discounted reward), minus
the invalid-action penalty.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from typing import Any, Mapping

import numpy as np
from minigrid.core.constants import COLOR_NAMES, IDX_TO_COLOR, IDX_TO_OBJECT
from minigrid.core.roomgrid import RoomGrid
from minigrid.envs.babyai import GoTo, Open, Pickup
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling, RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)
from minigrid.utils.baby_ai_bot import BabyAIBot

from verlog.envs import balrog_protocol
from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.babyai import BALROG_KINDS, KINDS, TASKS  # noqa: F401 (TASKS: the games, as before)
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.family import check_protocol
from verlog.envs.held_out import HELD_OUT_SHARE, draw_level
from verlog.envs.progression import goal_value
from verlog.envs.text import offset_phrase
from verlog.step_info import step_info

LAYOUTS: tuple[str, ...] = ("local", "maze")

#: the text actions, in minigrid's numbering (index = minigrid action id); ``done`` is not offered
ACTIONS: tuple[str, ...] = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
#: what ``info["action"]`` says when an invalid answer ran the default no-op
NOOP = "no-op"
_MINIGRID_NOOP = 6  # minigrid's ``done`` action: changes nothing in these levels

SYNONYMS: Mapping[str, str] = {
    "left": "turn left",
    "rotate left": "turn left",
    "turn to the left": "turn left",
    "right": "turn right",
    "rotate right": "turn right",
    "turn to the right": "turn right",
    "forward": "go forward",
    "move forward": "go forward",
    "go straight": "go forward",
    "move ahead": "go forward",
    "step forward": "go forward",
    "pickup": "pick up",
    "pick": "pick up",
    "grab": "pick up",
    "take": "pick up",
    "put down": "drop",
    "drop it": "drop",
    "open": "toggle",
    "unlock": "toggle",
    "close": "toggle",
    "open door": "toggle",
    "use": "toggle",
}

ACTION_HELP: Mapping[str, str] = {
    "turn left": "turn 90 degrees to your left, staying on the same cell",
    "turn right": "turn 90 degrees to your right, staying on the same cell",
    "go forward": "move one cell forward, if that cell is empty floor or an open door",
    "pick up": "pick up the object directly in front of you (you carry one object at most)",
    "drop": "put the object you carry onto the empty cell directly in front of you",
    "toggle": (
        "open or close the door directly in front of you; a locked door opens only while you "
        "carry the key of its colour (toggling a box opens and removes it)"
    ),
}

#: what each action does, as the BALROG-protocol instruction lists it
BALROG_ACTION_HELP: Mapping[str, str] = {
    "turn left": "turn to your left",
    "turn right": "turn to your right",
    "go forward": "move one step forward",
    "pick up": "pick up the object in front of you",
    "drop": "drop the object you are carrying",
    "toggle": "act on the object in front of you (open a door, a box)",
}

DEFAULT_MAX_STEPS = 128
_VIEW = 7  # minigrid's egocentric view is 7x7; the agent sits at the bottom middle
_AGENT = (_VIEW // 2, _VIEW - 1)
_DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}


# --------------------------------------------------------------------------------------------
# levels


class LocalTaskLevel(RoomGridLevel):
    """A BabyAI level for one task family, in BALROG's small layout or a 3x3-room maze.

    ``rooms=1``: the ``goto``/``pickup``/``pick_up_seq_go_to`` tasks in one room with
    ``num_dists + 1`` (``+ 2`` for the sequence) random keys, balls and boxes; ``open``: two rooms
    side by side, the door between them locked, its key and ``num_dists`` objects in the agent's
    room. ``rooms=3``: a 3x3 maze connected by random doors (used for ``pick_up_seq_go_to`` in the
    ``maze`` layout). Generation rejects levels where an object cannot be reached.
    """

    def __init__(
        self,
        task: str,
        rooms: int = 1,
        room_size: int = 8,
        num_dists: int = 8,
        max_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if task not in KINDS:
            raise ValueError(f"unknown BabyAI mission kind {task!r}; expected one of {KINDS}")
        if task == "open" and rooms != 1:
            raise ValueError("the local 'open' level is fixed at two rooms (use rooms=1)")
        self.task = task
        self.num_dists = num_dists
        num_rows, num_cols = (1, 2) if task == "open" else (rooms, rooms)
        super().__init__(
            room_size=room_size,
            num_rows=num_rows,
            num_cols=num_cols,
            max_steps=max_steps,
            **kwargs,
        )

    def _gen_grid(self, width: int, height: int) -> None:
        # RoomGridLevel prints every rejected sample; this retry loop stays silent
        for _ in range(10_000):
            try:
                RoomGrid._gen_grid(self, width, height)
                self.gen_mission()
                self.validate_instrs(self.instrs)
            except (RejectSampling, RecursionError):
                continue
            break
        else:  # pragma: no cover - never seen in practice
            raise RuntimeError(f"could not generate a BabyAI {self.task} level")
        self.surface = self.instrs.surface(self)
        self.mission = self.surface

    def gen_mission(self) -> None:
        if self.task == "open":
            self._gen_open()
            return
        self.place_agent()
        self.connect_all()
        extra = 2 if self.task in ("pick_up_seq_go_to", "putnext") else 1
        objs = self.add_distractors(num_distractors=self.num_dists + extra, all_unique=False)
        self.check_objs_reachable()
        self.instrs = _object_mission(self, self.task, self._rand_elem(objs), objs)

    def _gen_open(self) -> None:
        color = self._rand_elem(COLOR_NAMES)
        locked = self._rand_int(0, 2)  # which of the two rooms is behind the locked door
        free = 1 - locked
        self.add_door(locked, 0, door_idx=0 if locked == 0 else 2, color=color, locked=True)
        self.add_object(free, 0, "key", color)
        self.add_distractors(free, 0, num_distractors=self.num_dists, all_unique=False)
        self.place_agent(free, 0)
        self.check_objs_reachable()
        self.instrs = OpenInstr(ObjDesc("door", self._rand_elem([None, color])))


def _object_mission(
    level: RoomGridLevel, task: str, first: Any, objs: list[Any]
) -> GoToInstr | PickupInstr | PutNextInstr | BeforeInstr | AfterInstr:
    """The mission of an object task about ``first`` (one of ``objs``): go to it, pick it up, put
    it next to another object, or pick it up and go to another object (phrased with "then" or
    "after you")."""
    desc = ObjDesc(first.type, first.color)
    if task == "goto":
        return GoToInstr(desc)
    if task == "pickup":
        return PickupInstr(desc)
    other = ObjDesc(*_other_kind(level, first, objs))
    if task == "putnext":
        return PutNextInstr(desc, other)
    pick, go = PickupInstr(desc), GoToInstr(other)
    return BeforeInstr(pick, go) if level._rand_bool() else AfterInstr(go, pick)


def _other_kind(level: RoomGridLevel, first: Any, objs: list[Any]) -> tuple[str, str]:
    """The (type, colour) of a random second object of ``objs``: it may describe the same kind as
    ``first`` only when another object of that kind exists (the mission must not name the very
    object being carried or moved as its goal)."""
    same_kind = [o for o in objs if (o.type, o.color) == (first.type, first.color)]
    second = level._rand_elem(objs)
    if len(same_kind) == 1:
        while (second.type, second.color) == (first.type, first.color):
            second = level._rand_elem(objs)
    return second.type, second.color


#: BabyAI-Text keeps missions naming these for its test levels: BALROG's training levels redraw them
BALROG_EXCLUDED_PAIRS: tuple[str, ...] = ("yellow box", "red key", "red door", "green ball", "grey door")
#: the colours of BALROG's locked doors (red and grey are test-only)
BALROG_DOOR_COLORS: tuple[str, ...] = ("yellow", "green", "blue", "purple")


class BalrogTaskLevel(RoomGridLevel):
    """BALROG's level for one BabyAI task: BabyAI-Text's ``MixedTrainLocal`` family restricted
    to that mission kind, with no distractors (BALROG's ``num_dists: 0``).

    One 8x8 room with one object (``goto``, ``pickup``) or two (``putnext``,
    ``pick_up_seq_go_to``); ``open``: two rooms side by side, the door between them locked, its key
    in the agent's room. A level is redrawn while an object is unreachable or the mission names an
    excluded colour/object pair (:data:`BALROG_EXCLUDED_PAIRS`). The step cap is computed at each
    reset from the mission, as minigrid does (``max_steps=None``).
    """

    def __init__(self, task: str, num_dists: int = 0, max_steps: int | None = None, **kwargs: Any) -> None:
        if task not in KINDS:
            raise ValueError(f"unknown BabyAI mission kind {task!r}; expected one of {KINDS}")
        self.task = task
        self.num_dists = num_dists
        num_cols = 2 if task == "open" else 1
        super().__init__(room_size=8, num_rows=1, num_cols=num_cols, max_steps=max_steps, **kwargs)

    _gen_grid = LocalTaskLevel._gen_grid  # the same silent rejection loop

    def gen_mission(self) -> None:
        if self.task == "open":
            self._gen_open()
        else:
            self.place_agent()
            extra = 1 if self.task in ("goto", "pickup") else 2
            objs = self.add_distractors(num_distractors=self.num_dists + extra, all_unique=False)
            if not self.check_objs_reachable(raise_exc=False):
                raise RejectSampling("unreachable object")
            # add_distractors makes keys, balls and boxes only
            self.instrs = _object_mission(self, self.task, self._rand_elem(objs), objs)
        surface = self.instrs.surface(self)
        if any(pair in surface for pair in BALROG_EXCLUDED_PAIRS):
            raise RejectSampling("excluded colour/object pair")

    def _gen_open(self) -> None:
        """BabyAI-Text's ``open`` level, with the original's draws in the original's order, so a
        seed gives BALROG's level: each try rebuilds the two rooms (redrawing the door position
        between them), draws the door colour, the locked room and the wall its door is in (again
        while that wall is the outer one), the key's room (again while it is the locked one), then
        the distractors of the other room, the agent's cell (again while in the locked room) and
        whether the mission names the colour; a try whose objects are not all reachable or whose
        mission names an excluded pair is drawn again."""
        accepted = False
        while not accepted:
            RoomGrid._gen_grid(self, self.width, self.height)
            color = self._rand_elem(BALROG_DOOR_COLORS)
            locked = self._add_locked_room(color)
            self.connect_all()
            for j in range(self.num_rows):
                for i in range(self.num_cols):
                    if self.get_room(i, j) is not locked:
                        self.add_distractors(i, j, num_distractors=self.num_dists, all_unique=False)
            while True:
                self.place_agent()
                if self.room_from_pos(*self.agent_pos) is not locked:
                    break
            reachable = self.check_objs_reachable(raise_exc=False)
            self.instrs = OpenInstr(ObjDesc("door", self._rand_elem([None, color])))
            surface = self.instrs.surface(self)
            accepted = reachable and not any(pair in surface for pair in BALROG_EXCLUDED_PAIRS)

    def _add_locked_room(self, color: str) -> Any:
        """A room behind a locked door of ``color`` (drawn: room, then wall, until the wall is
        shared with another room) and its key in another room (drawn); returns the locked room."""
        while True:
            i, j, wall = self._rand_int(0, self.num_cols), self._rand_int(0, self.num_rows), self._rand_int(0, 4)
            room = self.get_room(i, j)
            if room.neighbors[wall] is not None:
                self.add_door(i, j, wall, color=color, locked=True)
                break
        while True:
            i, j = self._rand_int(0, self.num_cols), self._rand_int(0, self.num_rows)
            if self.get_room(i, j) is not room:
                self.add_object(i, j, "key", color)
                return room


def make_level(task: str, layout: str = "local", max_steps: int | None = None) -> RoomGridLevel:
    """The minigrid level behind a task: see the module docstring for the two layouts."""
    if task not in KINDS:
        raise ValueError(f"unknown BabyAI mission kind {task!r}; expected one of {KINDS}")
    if layout == "local":
        return LocalTaskLevel(task, max_steps=max_steps)
    if layout == "maze":
        registered = {"goto": GoTo, "pickup": Pickup, "open": Open}
        if task in registered:
            return registered[task](max_steps=max_steps)
        return LocalTaskLevel(task, rooms=3, num_dists=16, max_steps=max_steps)
    raise ValueError(f"unknown BabyAI layout {layout!r}; expected one of {LAYOUTS}")


# --------------------------------------------------------------------------------------------
# text


def relative_position(forward: int, right: int) -> str:
    """Words for a cell ``forward`` steps ahead and ``right`` steps to the right (< 0: left)."""
    return offset_phrase((forward, "forward", "back"), (right, "right", "left"))


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def describe_cell(cell: np.ndarray) -> str | None:
    """Name one encoded view cell ("a locked red door", "a wall"); ``None`` for floor/unseen."""
    kind = IDX_TO_OBJECT[int(cell[0])]
    if kind in ("unseen", "empty", "floor", "agent"):
        return None
    if kind == "wall":
        return "a wall"
    color = IDX_TO_COLOR[int(cell[1])]
    if kind == "door":
        return _with_article(f"{_DOOR_STATES.get(int(cell[2]), 'closed')} {color} door")
    return _with_article(f"{color} {kind}")


def describe_view(image: np.ndarray, mission: str, carrying: Any | None) -> str:
    """The observation text from minigrid's encoded egocentric view (``obs["image"]``).

    Objects and doors are listed nearest first with their position relative to the agent; walls
    only as the nearest wall straight ahead, to the left and to the right (that is what bounds the
    agent's moves); then the cell directly in front and what the agent carries.
    """
    ax, ay = _AGENT
    things: list[tuple[int, int, int, str]] = []
    for x in range(_VIEW):
        for y in range(_VIEW):
            if (x, y) == _AGENT:
                continue
            name = describe_cell(image[x, y])
            if name is None or name == "a wall":
                continue
            forward, right = ay - y, x - ax
            things.append((forward + abs(right), forward, right, name))
    things.sort()
    lines = [f"- {name} {relative_position(f, r)}" for _, f, r, name in things]

    def wall_along(cells: list[tuple[int, int]], forward_of: Any, right_of: Any) -> str | None:
        for x, y in cells:
            if describe_cell(image[x, y]) == "a wall":
                return f"- a wall {relative_position(forward_of(x, y), right_of(x, y))}"
        return None

    rays = (
        [(ax, y) for y in range(ay - 1, -1, -1)],  # straight ahead
        [(x, ay) for x in range(ax - 1, -1, -1)],  # to the left
        [(x, ay) for x in range(ax + 1, _VIEW)],  # to the right
    )
    for ray in rays:
        wall = wall_along(ray, lambda x, y: ay - y, lambda x, y: x - ax)
        if wall:
            lines.append(wall)

    front = describe_cell(image[ax, ay - 1]) or "empty floor"
    held = _with_article(f"{carrying.color} {carrying.type}") if carrying is not None else "nothing"
    seen = "\n".join(lines) if lines else "- nothing but empty floor"
    return f"Mission: {mission}\nYou see:\n{seen}\nDirectly in front of you: {front}.\nYou are carrying {held}."


def _steps(n: int) -> str:
    return f"{n} step{'s' if n > 1 else ''}"


def describe_view_balrog(image: np.ndarray, carrying: Any | None) -> str:
    """BabyAI-Text's description of the encoded egocentric view (``obs["image"]``), as BALROG
    shows it (see the module docstring for the rules); lines are joined with newlines."""
    ax, ay = _AGENT
    lines: list[str] = []
    if carrying is not None:
        lines.append(f"You carry a {carrying.color} {carrying.type}")
    rays = (
        ([(ax, y) for y in range(ay - 1, -1, -1)], "forward"),
        ([(x, ay) for x in range(ax - 1, -1, -1)], "left"),
        ([(x, ay) for x in range(ax + 1, _VIEW)], "right"),
    )
    for cells, word in rays:
        for distance, (x, y) in enumerate(cells, start=1):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if kind in ("unseen", "empty"):
                continue
            if kind == "wall":
                lines.append(f"a wall {_steps(distance)} {word}")
            break  # anything else hides the wall behind it
    for x in range(_VIEW):
        for y in range(_VIEW):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if (x, y) == _AGENT or kind in ("unseen", "empty", "wall"):
                continue
            color = IDX_TO_COLOR[int(image[x, y, 1])]
            name = f"a {_DOOR_STATES[int(image[x, y, 2])]} {color} door" if kind == "door" else f"a {color} {kind}"
            forward, right = ay - y, x - ax
            side = f"{_steps(abs(right))} {'right' if right > 0 else 'left'}"
            if right == 0:
                where = f"{_steps(forward)} forward"
            elif forward == 0:
                where = side
            else:
                where = f"{side} and {_steps(forward)} forward"
            lines.append(f"{name} {where}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# environment


#: the task whose levels are BALROG's five mission kinds in turn, kind ``seed % 5`` (BabyAI-Text's
#: ``MixedTrainLocal``, BALROG's BabyAI level, before BALROG restricts it to one kind): one policy
#: trained on all of them
MIXED = "mixed"
MIXED_TASKS = BALROG_KINDS

#: the first held-out seed: verlog's evaluations play seeds from here (``eval.seed``, ``eval.validation_seed``)
HELD_OUT_SEED_START = 1_000_000

#: pixels per cell of BALROG's BabyAI image (``get_pov_render(tile_size=16)`` in its
#: ``babyai_text/clean_lang_wrapper.py``)
POV_TILE_SIZE = 16


class BabyAITextEnv(TextEnv):
    """One BabyAI task family as a seeded text game (see the module docstring).

    ``seed`` seeds the first ``reset()`` that is given no seed; later unseeded resets continue the
    same random stream, so a seeded env always plays the same sequence of episodes. A seed from
    :data:`HELD_OUT_SEED_START` (verlog's evaluation seeds) plays a level whose content (mission,
    objects, doors, walls) is in the held-out share ``held_out_share`` of all contents, a seed below
    it one outside (:mod:`verlog.envs.held_out`): training never plays an evaluation level. With
    ``protocol="balrog"`` the share is 0 unless given: each seed then plays BALROG's own level of that
    seed (its episodes are reproduced seed for seed); give ``held_out_share`` (e.g. 0.25) to train on
    BALROG's levels and evaluate on contents training never saw.
    ``level`` is the underlying minigrid environment (for oracles such as ``BabyAIBotAgent``).
    """

    actions = ACTIONS
    action_help = ACTION_HELP

    def __init__(
        self,
        task: str,
        seed: int | None = None,
        *,
        invalid_action_penalty: float | None = None,
        max_steps: int | None = None,
        layout: str = "local",
        default_action: str | None = None,
        protocol: str = "verlog",
        held_out_share: float | None = None,
    ) -> None:
        check_protocol(protocol)
        if held_out_share is None:  # BALROG's seeds play BALROG's levels; verlog's split by content
            held_out_share = 0.0 if protocol == "balrog" else HELD_OUT_SHARE
        if not (isinstance(held_out_share, (int, float)) and 0 <= held_out_share < 1):
            raise ValueError(
                f"held_out_share={held_out_share!r}: a number in [0, 1), the share of level contents kept for "
                "the held-out seeds (0: seeds only)"
            )
        self.held_out_share = float(held_out_share)
        if protocol == "balrog":
            if layout != "local":
                raise ValueError("BALROG's BabyAI levels have one layout: leave layout unset with protocol='balrog'")
            default_action = "go forward" if default_action is None else default_action
            invalid_action_penalty = 0.0 if invalid_action_penalty is None else invalid_action_penalty
        if default_action is not None and default_action not in ACTIONS:
            raise ValueError(f"default_action must be one of {ACTIONS} or None (a no-op)")
        if max_steps is None and layout == "local" and protocol == "verlog":
            max_steps = DEFAULT_MAX_STEPS
        self.task = task
        self.layout = layout
        self.protocol = protocol
        self.name = f"babyai:{task}"
        self.invalid_action_penalty = (
            DEFAULT_INVALID_ACTION_PENALTY if invalid_action_penalty is None else invalid_action_penalty
        )
        self.default_action = default_action
        #: the mission kinds this game plays: its task's, or (``mixed``) BALROG's five, by the seed
        self.kinds: tuple[str, ...] = MIXED_TASKS if task == MIXED else (task,)
        self._levels = {
            kind: BalrogTaskLevel(kind, max_steps=max_steps)
            if protocol == "balrog"
            else make_level(kind, layout, max_steps)
            for kind in self.kinds
        }
        self.level = self._levels[self.kinds[0]]
        if len(self.kinds) > 1:  # every kind's step cap known at once (the longest bounds an episode)
            for kind in self.kinds:
                self.level = self._levels[kind]
                self._draw(0)
        self._resets = 0
        self._seed = seed
        self._observation = ""
        self._done = True
        self._steps = 0

    @property
    def max_steps(self) -> int:  # type: ignore[override]
        """The step cap of the current episode (minigrid's own for the maze layout); of task
        ``mixed``, the longest of its kinds' caps (what bounds any of its episodes)."""
        if len(self.kinds) > 1:
            return max(int(level.max_steps or 0) for level in self._levels.values())
        return int(self.level.max_steps)

    @property
    def mission(self) -> str:
        return str(self.level.mission)

    def reset(self, seed: int | None = None) -> str:
        if seed is None:
            seed, self._seed = self._seed, None
        else:
            self._seed = None
        if len(self.kinds) > 1:  # task mixed: the seed's kind (in turn, so each is played as often)
            self.level = self._levels[self.kinds[(seed if seed is not None else self._resets) % len(self.kinds)]]
        self._resets += 1
        if seed is None:
            obs = self._draw(None)
        else:  # held out by content too (verlog.envs.held_out)
            obs = draw_level(
                seed,
                held_out=seed >= HELD_OUT_SEED_START,
                share=self.held_out_share,
                draw=self._draw,
                content_of=lambda _obs: self.level_content(),
            )
        self._done = False
        self._steps = 0
        self._observation = self._render(obs)
        return self._observation

    def _draw(self, seed: int | None) -> Any:
        # the registered maze levels print every rejected sample: keep that out of the terminal
        with contextlib.redirect_stdout(io.StringIO()):
            obs, _ = self.level.reset(seed=seed)
        return obs

    def level_content(self) -> str:
        """What defines the current level, the agent's start left out: its mission and its grid
        (walls, objects, doors and their states)."""
        grid = self.level.grid.encode()
        return f"{self.level.mission}|{grid.shape}|{hashlib.sha256(grid.tobytes()).hexdigest()}"

    def observation_image(self) -> Any:
        """The agent's view as BALROG's BabyAI wrapper draws it: minigrid's
        ``get_pov_render(tile_size=16)`` (the 7x7 cells in front of the agent, the agent at the
        bottom middle facing up, the cells it cannot see shaded: 112x112 pixels)."""
        from verlog.envs.balrog_vision import rgb_image

        return rgb_image(self.level.get_pov_render(tile_size=POV_TILE_SIZE))

    def _render(self, obs: Mapping[str, Any]) -> str:
        if self.protocol == "balrog":
            return describe_view_balrog(obs["image"], self.level.carrying)
        return describe_view(obs["image"], self.mission, self.level.carrying)

    def _parse(self, action_text: str) -> str | None:
        if self.protocol == "balrog":
            return balrog_protocol.parse_answer(action_text, ACTIONS)
        return parse_action(action_text, ACTIONS, SYNONYMS).action

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over: call reset() first")
        chosen = self._parse(action_text)
        valid = chosen is not None
        if chosen is not None:
            executed, action_id = chosen, ACTIONS.index(chosen)
        elif self.default_action is not None:
            executed, action_id = self.default_action, ACTIONS.index(self.default_action)
        else:
            executed, action_id = NOOP, _MINIGRID_NOOP
        obs, native_reward, terminated, truncated, _ = self.level.step(action_id)
        self._steps += 1
        success = bool(terminated and native_reward > 0)
        truncated = bool(truncated and not terminated)
        reward = (1.0 if success else 0.0) - (0.0 if valid else self.invalid_action_penalty)
        self._done = bool(terminated or truncated)
        info = step_info(
            executed,
            valid,
            self._steps,
            done=self._done,
            success=success,
            progression=goal_value(success),  # BALROG's: 1 once the mission is accomplished
        )
        self._observation = self._render(obs)
        return StepResult(self._observation, reward, bool(terminated), truncated, info)

    @property
    def instruction(self) -> str:
        if self.protocol == "balrog":
            return self._balrog_instruction()
        actions = self.actions_text()
        return (
            "You are an agent in BabyAI, a grid world of rooms with walls, doors, keys, balls "
            "and boxes. You see a 7x7 area: the cells ahead of you and 3 cells to each side; "
            "walls and closed doors block your sight. Positions are given relative to you: "
            '"forward" is the way you face, "left" and "right" are to your sides.\n'
            "To go to an object, end on the cell next to it, facing it. To pick something up, "
            "face it from the next cell. A locked door opens only while you carry the key of "
            "its colour.\n"
            f"Valid actions:\n{actions}\n"
            f"{ANSWER_FORMAT}\n"
            # what changes from level to level comes last: every level's prompt then starts with
            # the same long text, which the engine's prefix cache and the trainer compute once
            f"Your mission: {self.mission}\n"
            f"You have at most {self.max_steps} steps."
        )

    def _balrog_instruction(self) -> str:
        """BALROG's instruction facts, in verlog's words: the goal, the six actions with what each
        does, two tips; the answer rule comes with each observation (``balrog_protocol``)."""
        actions = ",\n".join(f"{name}: {BALROG_ACTION_HELP[name]}" for name in ACTIONS)
        return (
            f"You are an agent in a small grid world. Your goal is to {self.mission}. These are the "
            f"actions you can take, each followed by what it does:\n\n{actions}.\n\n"
            "You will now be shown what you observe.\n\n"
            "Tips:\n"
            "- When the object you want to interact with is right in front of you, 'toggle' acts on it.\n"
            "- Repeating one action is pointless while the observation stays the same.\n\n"
            "PLAY!"
        )


# --------------------------------------------------------------------------------------------
# oracle


class BabyAIBotAgent:
    """minigrid's ``BabyAIBot`` playing through the text interface.

    The bot plans on the true level state (it is an oracle); each of its moves is turned into an
    answer (``"ACTION: <name>"``, or the bare name under BALROG's protocol) that the caller passes
    to ``env.step``. Call ``reset`` after
    every ``env.reset``.
    """

    def __init__(self, env: BabyAITextEnv) -> None:
        self.env = env
        self._bot: BabyAIBot | None = None
        self._last: int | None = None

    def reset(self) -> None:
        self._bot = BabyAIBot(self.env.level)
        self._last = None

    def act(self, observation: str = "") -> str:
        """The bot's next answer (the observation text is not needed: the bot sees the level)."""
        if self._bot is None:
            self.reset()
        assert self._bot is not None
        action = int(self._bot.replan(self._last))
        self._last = action
        name = ACTIONS[action] if action < len(ACTIONS) else "done"  # "done" is not valid here
        # BALROG's protocol accepts only the bare action name
        return name if self.env.protocol == "balrog" else f"ACTION: {name}"


def run_bot_episode(env: BabyAITextEnv, seed: int | None = None) -> tuple[bool, int]:
    """Play one episode with ``BabyAIBotAgent`` through ``env.step``; returns (success, steps)."""
    observation = env.reset(seed)
    agent = BabyAIBotAgent(env)
    agent.reset()
    steps = 0
    while True:
        result = env.step(agent.act(observation))
        steps += 1
        observation = result.observation
        if result.done:
            return bool(result.info.get("success")), steps
