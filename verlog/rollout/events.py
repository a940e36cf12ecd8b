"""How a graph's environment node reports rewards: a LangChain custom event.

Graphs stay free of training code: ``report_reward`` is a thin wrapper over LangChain's
``adispatch_custom_event``, which reaches whatever callbacks the run was given. Under training
that is verlog's recorder, which adds the reward to the latest model call; in production there
is no such handler and the event costs nothing.

Where the run's only listeners for custom events are verlog's recorders (the case under
training), the event is handed to them directly, as LangChain would hand it (the same name, data,
run id, tags and metadata), without LangChain building a callback manager for each event first
(``benchmarks/rollout_overhead.py``, async nodes: +0.31 -> +0.27 ms a turn; sync nodes: within the
run-to-run spread). With any other listener (a tracer, ``astream_events``, a user's
handler) the event goes through LangChain's dispatch, as always.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypedDict

from langchain_core.callbacks import BaseCallbackManager, adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config

from verlog.step_info import StepInfo

__all__ = ["REWARD_EVENT", "DirectListener", "RewardPayload", "areport_reward", "report_reward"]

#: the custom-event name the recorder listens for
REWARD_EVENT = "verlog.reward"


class DirectListener:
    """Marks a callback handler (verlog's recorder) whose ``on_custom_event`` may be called
    directly, as LangChain's dispatch calls an inline handler."""


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
    if not _delivered(payload, config):
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
    payload = _payload(reward, terminated, truncated, info, next_messages)
    if not _delivered(payload, config):
        dispatch_custom_event(REWARD_EVENT, payload, config=config)


def _delivered(payload: RewardPayload, config: RunnableConfig | None) -> bool:
    """Hand the event to the run's listeners directly when every one of them is a
    :class:`DirectListener` (see the module's doc); ``False``: left to LangChain's dispatch
    (other listeners, or no run to report from, which LangChain's dispatch reports)."""
    config = ensure_config(config)
    manager = config.get("callbacks")
    if not isinstance(manager, BaseCallbackManager) or manager.parent_run_id is None:
        return False
    listeners = [h for h in manager.handlers if not h.ignore_custom_event]
    if not listeners or not all(isinstance(h, DirectListener) and h.run_inline for h in listeners):
        return False
    # what LangChain's dispatch adds to the manager it makes: the config's tags and metadata
    tags = [*manager.tags, *(t for t in config.get("tags", ()) if t not in manager.tags)]
    metadata = {**manager.metadata, **config.get("metadata", {})}
    for handler in listeners:
        handler.on_custom_event(REWARD_EVENT, payload, run_id=manager.parent_run_id, tags=tags, metadata=metadata)
    return True
