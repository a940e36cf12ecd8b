"""What every config section shares: strict sections (unknown keys refused), the error a bad
config raises, and the checks of values several sections take (JSON objects, ``file.py:function``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    pass


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names every bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object (command-line flags, environment variables); a
    ``ValueError`` naming ``what`` when it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {text!r}")
    return value


def _keyword_mapping(value: Any, what: str, example: str) -> dict[str, Any]:
    """``value`` as keyword arguments: a mapping whose keys are Python identifiers."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of {what}, e.g. {example}")
    bad = [k for k in value if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise ValueError(f"keys must be argument names ({what}); not {', '.join(repr(k) for k in bad)}")
    return value


#: the function verl's ``custom_reward_function`` names when its ``name`` is not given
VERL_REWARD_FUNCTION_NAME = "compute_score"
#: the largest reward magnitude taken as a training signal (a reward is on the scale of an episode's
#: return; one of 1e300 would swamp every advantage it is whitened with): without ``reward.clip``, a
#: reward component beyond +-this fails its episode (``reward.max_abs``'s default), and feedback
#: beyond it is refused (``verlog.traces.records.check_reward``)
REWARD_MAX_ABS = 1e6

#: the most ``interrupt()`` pauses one episode's responder answers (``multi_turn.langgraph.max_resumes``)
DEFAULT_MAX_RESUMES = 16

#: where a slot runner's episodes run (``rollout.slot_threads``, ``SlotRunner(slot_threads=)``): on
#: the rollout's own event loop until a graph makes a blocking model call in an ``async def`` node
#: (``auto``), or each slot on a thread of its own from the start (``always``)
SlotThreads = Literal["auto", "always"]
SLOT_THREADS: tuple[str, ...] = get_args(SlotThreads)


def _check_function_target(value: str) -> str:
    """``file.py:function`` or ``package.module:function`` (a ``ValueError`` otherwise)."""
    target, sep, name = value.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError("must be file.py:function or package.module:function, e.g. rewards.py:correct")
    return value
