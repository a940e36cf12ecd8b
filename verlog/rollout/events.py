"""How a graph's environment node reports rewards: a LangChain custom event.

Graphs stay free of training code: ``report_reward`` is a thin wrapper over LangChain's
``adispatch_custom_event``, which reaches whatever callbacks the run was given. Under training
that is verlog's recorder, which adds the reward to the latest model call; in production there
is no such handler and the event costs nothing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypedDict

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig

from verlog.step_info import StepInfo

__all__ = ["REWARD_EVENT", "RewardPayload", "areport_reward", "report_reward"]

#: the custom-event name the recorder listens for
REWARD_EVENT = "verlog.reward"


class RewardPayload(TypedDict, total=False):
    """The data of a :data:`REWARD_EVENT` (what the recorder reads): ``reward`` (required; the
    rewards of one model call are summed), ``terminated``, ``truncated``, the step's ``info`` (a
    :class:`verlog.step_info.StepInfo`, merged into the turn's) and, with ``truncated``, the
    ``next_messages`` the critic bootstraps from."""

    reward: float
    terminated: bool
    truncated: bool
    info: StepInfo
    next_messages: list[BaseMessage]


def _payload(
    reward: float,
    terminated: bool,
    truncated: bool,
    info: Mapping[str, Any] | None,
    next_messages: Sequence[BaseMessage] | None,
) -> RewardPayload:
    payload = RewardPayload(
        reward=float(reward), terminated=bool(terminated), truncated=bool(truncated), info=dict(info or {})
    )  # type: ignore[typeddict-item]
    if next_messages is not None:
        payload["next_messages"] = list(next_messages)
    return payload


async def areport_reward(
    reward: float,
    *,
    terminated: bool = False,
    truncated: bool = False,
    info: StepInfo | Mapping[str, Any] | None = None,
    next_messages: Sequence[BaseMessage] | None = None,
    config: RunnableConfig | None = None,
) -> None:
    """Report the environment's reward for the latest model call (from an async node).

    ``terminated``: the task ended (win or loss): nothing follows, no value to bootstrap from.
    ``truncated``: a step limit cut the episode; the state after the cut still has a value.
    ``next_messages``: with ``truncated``, the prompt the model would have been given next (what
    the policy node would send): under training the critic's value of it is the cut turn's
    bootstrap. Without it a truncated turn bootstraps from 0, like a terminated one.
    ``info``: environment facts to keep with the turn (``success``, ``valid_action``, ...).
    Pass the node's ``config`` on Python 3.10, where it does not propagate by itself.
    """
    payload = _payload(reward, terminated, truncated, info, next_messages)
    await adispatch_custom_event(REWARD_EVENT, payload, config=config)


def report_reward(
    reward: float,
    *,
    terminated: bool = False,
    truncated: bool = False,
    info: StepInfo | Mapping[str, Any] | None = None,
    next_messages: Sequence[BaseMessage] | None = None,
    config: RunnableConfig | None = None,
) -> None:
    """Report the environment's reward for the latest model call (from a sync node); the
    arguments are those of ``areport_reward``."""
    dispatch_custom_event(REWARD_EVENT, _payload(reward, terminated, truncated, info, next_messages), config=config)
