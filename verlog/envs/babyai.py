"""BabyAI (on ``minigrid``) played in text.

Four task families, the BabyAI tasks of Verlog's results tables (which come from BALROG):

``goto``
    "go to the red ball": end facing the object, one step away.
``pickup``
    "pick up a blue key".
``pick_up_seq_go_to``
    "pick up the grey box, then go to a red ball" (or "go to ... after you pick up ...").
``open``
    "open the yellow door": the door is locked, so the agent first fetches the key of its colour.

Two layouts:

``layout="local"`` (default)
    BALROG's levels (minigrid's ``MixedTrainLocal`` families): one 8x8 room holding 9 objects
    (10 for ``pick_up_seq_go_to``); for ``open`` two rooms joined by the locked door, the key and
    8 other objects in the agent's room. The 128-step cap of BALROG and Verlog fits these levels.
``layout="maze"``
    The registered 3x3-room levels ``BabyAI-GoTo-v0``, ``BabyAI-Pickup-v0``, ``BabyAI-Open-v0``
    (and the same maze for ``pick_up_seq_go_to``). They need far longer episodes (an oracle needs
    more than 128 steps in about 1 episode in 10), so the default cap there is minigrid's own.

The agent sees its 7x7 egocentric view (walls block sight), rendered as sentences with positions
relative to the agent ("a red ball 2 steps forward and 1 step left"). Reward is binary: 1 when
the mission is accomplished (not minigrid's time-discounted reward), minus the invalid-action
penalty. An answer naming no valid action runs a *no-op* by default (the world does not change
but the turn counts toward the step cap); ``default_action`` can name a real action instead.
"""

from __future__ import annotations

import contextlib
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
)
from minigrid.utils.baby_ai_bot import BabyAIBot

from verlog.envs.actions import ANSWER_FORMAT, DEFAULT_INVALID_ACTION_PENALTY, parse_action
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.progression import goal_value
from verlog.envs.text import offset_phrase

TASKS: tuple[str, ...] = ("goto", "pickup", "pick_up_seq_go_to", "open")
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
        if task not in TASKS:
            raise ValueError(f"unknown BabyAI task {task!r}; expected one of {TASKS}")
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
        extra = 2 if self.task == "pick_up_seq_go_to" else 1
        objs = self.add_distractors(num_distractors=self.num_dists + extra, all_unique=False)
        self.check_objs_reachable()
        target = self._rand_elem(objs)
        desc = ObjDesc(target.type, target.color)
        if self.task == "goto":
            self.instrs = GoToInstr(desc)
        elif self.task == "pickup":
            self.instrs = PickupInstr(desc)
        else:
            self.instrs = self._pick_up_then_go_to(target, objs)

    def _pick_up_then_go_to(self, first: Any, objs: list[Any]) -> BeforeInstr | AfterInstr:
        """Pick up ``first``, then go to another object; phrased with "then" or "after you"."""
        same_kind = [o for o in objs if (o.type, o.color) == (first.type, first.color)]
        second = self._rand_elem(objs)
        if len(same_kind) == 1:  # the goal must not name the very object being carried
            while (second.type, second.color) == (first.type, first.color):
                second = self._rand_elem(objs)
        pick = PickupInstr(ObjDesc(first.type, first.color))
        go = GoToInstr(ObjDesc(second.type, second.color))
        if self._rand_bool():
            return BeforeInstr(pick, go)
        return AfterInstr(go, pick)

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


def make_level(task: str, layout: str = "local", max_steps: int | None = None) -> RoomGridLevel:
    """The minigrid level behind a task: see the module docstring for the two layouts."""
    if task not in TASKS:
        raise ValueError(f"unknown BabyAI task {task!r}; expected one of {TASKS}")
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
    return (
        f"Mission: {mission}\n"
        f"You see:\n{seen}\n"
        f"Directly in front of you: {front}.\n"
        f"You are carrying {held}."
    )


# --------------------------------------------------------------------------------------------
# environment


class BabyAITextEnv(TextEnv):
    """One BabyAI task family as a seeded text game (see the module docstring).

    ``seed`` seeds the first ``reset()`` that is given no seed; later unseeded resets continue the
    same random stream, so a seeded env always plays the same sequence of episodes.
    ``level`` is the underlying minigrid environment (for oracles such as ``BabyAIBotAgent``).
    """

    actions = ACTIONS
    action_help = ACTION_HELP

    def __init__(
        self,
        task: str,
        seed: int | None = None,
        *,
        invalid_action_penalty: float = DEFAULT_INVALID_ACTION_PENALTY,
        max_steps: int | None = None,
        layout: str = "local",
        default_action: str | None = None,
    ) -> None:
        if default_action is not None and default_action not in ACTIONS:
            raise ValueError(f"default_action must be one of {ACTIONS} or None (a no-op)")
        if max_steps is None and layout == "local":
            max_steps = DEFAULT_MAX_STEPS
        self.task = task
        self.layout = layout
        self.name = f"babyai:{task}"
        self.invalid_action_penalty = invalid_action_penalty
        self.default_action = default_action
        self.level = make_level(task, layout, max_steps)
        self._seed = seed
        self._observation = ""
        self._done = True
        self._steps = 0

    @property
    def max_steps(self) -> int:  # type: ignore[override]
        """The step cap of the current episode (minigrid's own for the maze layout)."""
        return int(self.level.max_steps)

    @property
    def mission(self) -> str:
        return str(self.level.mission)

    def reset(self, seed: int | None = None) -> str:
        if seed is None:
            seed, self._seed = self._seed, None
        else:
            self._seed = None
        # the registered maze levels print every rejected sample: keep that out of the terminal
        with contextlib.redirect_stdout(io.StringIO()):
            obs, _ = self.level.reset(seed=seed)
        self._done = False
        self._steps = 0
        self._observation = self._render(obs)
        return self._observation

    def _render(self, obs: Mapping[str, Any]) -> str:
        return describe_view(obs["image"], self.mission, self.level.carrying)

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over: call reset() first")
        parsed = parse_action(action_text, ACTIONS, SYNONYMS)
        if parsed.action is not None:
            executed, action_id = parsed.action, ACTIONS.index(parsed.action)
        elif self.default_action is not None:
            executed, action_id = self.default_action, ACTIONS.index(self.default_action)
        else:
            executed, action_id = NOOP, _MINIGRID_NOOP
        obs, native_reward, terminated, truncated, _ = self.level.step(action_id)
        self._steps += 1
        success = bool(terminated and native_reward > 0)
        truncated = bool(truncated and not terminated)
        reward = (1.0 if success else 0.0) - (0.0 if parsed.valid else self.invalid_action_penalty)
        info: dict[str, Any] = {
            "action": executed,
            "valid_action": parsed.valid,
            "step": self._steps,
            "progression": goal_value(success),  # BALROG's: 1 once the mission is accomplished
        }
        self._done = bool(terminated or truncated)
        if self._done:
            info["success"] = success
        self._observation = self._render(obs)
        return StepResult(self._observation, reward, bool(terminated), truncated, info)

    @property
    def instruction(self) -> str:
        actions = self.actions_text()
        return (
            "You are an agent in BabyAI, a grid world of rooms with walls, doors, keys, balls "
            "and boxes. You see a 7x7 area: the cells ahead of you and 3 cells to each side; "
            "walls and closed doors block your sight. Positions are given relative to you: "
            '"forward" is the way you face, "left" and "right" are to your sides.\n'
            "To go to an object, end on the cell next to it, facing it. To pick something up, "
            "face it from the next cell. A locked door opens only while you carry the key of "
            "its colour.\n"
            f"Your mission: {self.mission}\n"
            f"You have at most {self.max_steps} steps.\n"
            f"Valid actions:\n{actions}\n"
            f"{ANSWER_FORMAT}"
        )


# --------------------------------------------------------------------------------------------
# oracle


class BabyAIBotAgent:
    """minigrid's ``BabyAIBot`` playing through the text interface.

    The bot plans on the true level state (it is an oracle); each of its moves is turned into an
    answer ``"ACTION: <name>"`` that the caller passes to ``env.step``. Call ``reset`` after
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
        return f"ACTION: {name}"


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
