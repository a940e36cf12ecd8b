"""Rewards computed outside the graph: reward functions and LLM judges run on finished episodes.

* ``result``    — what they see (``Trajectory``) and give back (``RewardResult``)
* ``functions`` — ``reward.functions``: a user's functions, loaded by ``file.py:name``, called safely
* ``judge``     — ``reward.judges``: LLM judges on an OpenAI-compatible endpoint or an embedded
  model, pointwise (a rubric) or group-relative (ranking a group's episodes)
* ``scorer``    — the whole ``reward`` section on an episode or a group, and how the outcome is
  added to the episode's turns

A graph never imports this package: a production graph is trained as it is, its reward computed
from its final state and the dataset row. Reward files may import it (``RewardResult``).
"""

from verlog.rewards.functions import TRAJECTORY_FIELDS, RewardError, RewardFunction, load_function
from verlog.rewards.result import RewardResult, Trajectory, as_result
from verlog.rewards.scorer import COMPONENT_PREFIX, SUCCESS_KEY, Outcome, RewardScorer, component_key

__all__ = [
    "COMPONENT_PREFIX",
    "SUCCESS_KEY",
    "TRAJECTORY_FIELDS",
    "Outcome",
    "RewardError",
    "RewardFunction",
    "RewardResult",
    "RewardScorer",
    "Trajectory",
    "as_result",
    "component_key",
    "load_function",
]
