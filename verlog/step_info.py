"""The info an environment reports with each step: its keys, and the one rule for "was it won".

Every verlog game's ``TextEnv.step`` returns a :class:`StepInfo` (built by :func:`step_info`), and
a graph's environment node passes it on with the step's reward (``areport_reward(..., info=...)``);
the recorder keeps it with the turn, and the episode's info is its last turn's. A graph of your own
may report any keys: only those below mean something to verlog.

Whether an episode was won is decided here only (:func:`episode_outcome`): ``success`` when the
environment reports it, else ``won`` (a game that reports only ``won``), else unknown. Training's
win rate counts the episodes whose outcome is known; evaluation scores an unknown outcome as a
loss.

This module imports nothing, so environments, the rollout, the trainers and evaluation all can.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, TypedDict

__all__ = [
    "ANCHOR_KEY",
    "PROGRESSION_KEY",
    "SUCCESS_KEY",
    "VALID_ACTION_KEY",
    "StepInfo",
    "episode_outcome",
    "episode_outcomes",
    "episode_won",
    "step_info",
]

#: whether the episode's task was done; reported once the episode has ended
SUCCESS_KEY = "success"
#: whether the answer named a valid action (an invalid one ran the game's default action)
VALID_ACTION_KEY = "valid_action"
#: BALROG's progression of the episode so far, 0-1 (:mod:`verlog.envs.progression`)
PROGRESSION_KEY = "progression"
#: the state the turn acted in, for GiGPO's anchor-state groups (any hashable text; the agent
#: graph reports the observation the model was shown)
ANCHOR_KEY = "anchor"


class StepInfo(TypedDict, total=False):
    """What a step reports besides its observation and reward (a game adds keys of its own).

    * ``action``: the action actually executed (the default action after an invalid answer);
    * ``valid_action``: whether the answer named a valid action;
    * ``step``: the steps taken so far in the episode;
    * ``progression``: BALROG's progression so far, 0-1 (see :mod:`verlog.envs.progression`);
    * ``success``: set once the episode has ended: whether its task was done;
    * ``won`` / ``lost``: the game's own verdict, for games that have one;
    * ``anchor``: the state the turn acted in (GiGPO), added by the agent graph.
    """

    action: str
    valid_action: bool
    step: int
    progression: float
    success: bool
    won: bool
    lost: bool
    anchor: str


def step_info(action: str, valid_action: bool, step: int, *, done: bool, success: bool, **extra: Any) -> StepInfo:
    """The info of one step: ``action``, ``valid_action``, ``step``, the game's ``extra`` keys,
    and ``success`` once the episode is ``done``."""
    info: dict[str, Any] = {"action": action, VALID_ACTION_KEY: valid_action, "step": step, **extra}
    if done:
        info[SUCCESS_KEY] = success
    return info  # type: ignore[return-value]


def episode_outcome(info: Mapping[str, Any]) -> bool | None:
    """Whether the episode whose last step reported ``info`` was won: ``info["success"]``, else
    ``info["won"]``, else ``None`` (the environment does not say)."""
    for key in (SUCCESS_KEY, "won"):
        if info.get(key) is not None:
            return bool(info[key])
    return None


def episode_outcomes(infos: Iterable[Mapping[str, Any]]) -> list[bool]:
    """The outcomes of the episodes (by their last ``info``) whose environment says whether they
    were won: what a win rate over them counts (the others are left out, not lost)."""
    return [won for won in map(episode_outcome, infos) if won is not None]


def episode_won(info: Mapping[str, Any]) -> bool:
    """:func:`episode_outcome`, an unknown outcome counting as not won."""
    return bool(episode_outcome(info))
