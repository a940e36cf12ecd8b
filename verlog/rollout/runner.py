"""Running graph episodes concurrently on one event loop, each recorded turn by turn.

``run_episode`` runs one graph invocation with a fresh ``TurnRecorder`` in its callbacks and
turns every way a run can go wrong into a recorded failed episode: an exception in the graph
(``error``), LangGraph's recursion limit (``recursion_limit``) or the episode timeout
(``timeout``), or a pause at LangGraph's ``interrupt()`` nobody answers (``interrupted``: without
an :class:`~verlog.rollout.interrupts.InterruptResponder`, or after its ``max_resumes`` answers;
with one, each pause is answered and the graph resumed through its checkpointer, all within the
one episode and its timeout). The timeout counts the graph's own time only (``GraphClock``): while any model call
of the episode is under way (queued on a busy engine, generating, held for an update) its clock
stands still, so how loaded the machine is never decides whether an episode times out. A graph that ends without calling a model at all is an ``error`` episode too (its
model is not the one it was given, or it returns before playing). A failed episode never yields
a training sample. A sync model call that would block the event loop serving it
(:class:`~verlog.backends.base.BlockingCallError`) is a fault of the graph's code, not of one
episode: it is raised.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
import uuid
from typing import Any, Awaitable, Callable, Iterable
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.errors import GraphRecursionError

from verlog.backends.base import BlockingCallError
from verlog.llm.chat_model import EPISODE_ID_KEY
from verlog.rollout.interrupts import InterruptResponder, describe, pending_interrupts
from verlog.rollout.outside_calls import track_outside_calls
from verlog.rollout.recorder import TurnRecorder, recording
from verlog.rollout.turn import Episode

#: the recursion limit of a run whose config sets none, of a graph that carries none of its own
DEFAULT_RECURSION_LIMIT = 100


def recursion_limit_of(graph: Any, graph_config: dict[str, Any] | None = None) -> int:
    """The recursion limit a run of ``graph`` gets: ``graph_config``'s, else the graph's own (a
    compiled graph's ``with_config(recursion_limit=...)``, as verlog's game graphs carry the limit
    of their longest episode), else :data:`DEFAULT_RECURSION_LIMIT`."""
    if graph_config and graph_config.get("recursion_limit") is not None:
        return int(graph_config["recursion_limit"])
    own = (getattr(graph, "config", None) or {}).get("recursion_limit")
    return int(own) if own is not None else DEFAULT_RECURSION_LIMIT


class GraphClock(BaseCallbackHandler):
    """The time an episode spends in its graph's own code: wall time, except while at least one
    of its chat-model calls is under way (from the call's start to its end or error, whoever
    answers it). A callback of the episode's run; ``now()`` is the clock ``timeout_s`` reads."""

    run_inline = True
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self, wall: Callable[[], float] = time.perf_counter):
        self._wall = wall
        self._lock = threading.Lock()  # sync nodes call models from worker threads
        self._calls: set[UUID] = set()
        self._since: float | None = None  # when the calls now under way began
        self._in_calls = 0.0  # wall seconds spent with a call under way, before ``_since``

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            if not self._calls:
                self._since = self._wall()
            self._calls.add(run_id)

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.on_chat_model_start(serialized, prompts, run_id=run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def _ended(self, run_id: UUID) -> None:
        with self._lock:
            self._calls.discard(run_id)
            if not self._calls and self._since is not None:
                self._in_calls += self._wall() - self._since
                self._since = None

    def model_seconds(self) -> float:
        """Wall seconds with a model call under way so far."""
        with self._lock:
            ongoing = self._wall() - self._since if self._since is not None else 0.0
            return self._in_calls + ongoing

    def now(self) -> float:
        """The graph's own time so far (an arbitrary origin)."""
        return self._wall() - self.model_seconds()


def episode_config(
    graph_config: dict[str, Any] | None,
    episode_id: str,
    recorder: TurnRecorder,
    graph: Any = None,
    clock: GraphClock | None = None,
) -> RunnableConfig:
    """The run config of one episode: the user's ``graph_config`` plus the recorder and ids (and
    the recursion limit, :func:`recursion_limit_of`). Each call gets a checkpointer thread of its
    own (``thread_id``: the episode id and a random suffix) unless ``graph_config`` names one, so
    a graph with a persistent checkpointer never continues an earlier run of the same episode."""
    config: dict[str, Any] = dict(graph_config or {})
    config["recursion_limit"] = recursion_limit_of(graph, graph_config)
    config["callbacks"] = [*(config.get("callbacks") or []), recorder, *([clock] if clock is not None else [])]
    config["metadata"] = {**(config.get("metadata") or {}), EPISODE_ID_KEY: episode_id}
    configurable = dict(config.get("configurable") or {})
    configurable.setdefault("thread_id", f"{episode_id}#{uuid.uuid4().hex[:12]}")  # checkpointers need one
    config["configurable"] = configurable
    return config  # type: ignore[return-value]


async def run_episode(
    graph: Runnable,
    graph_input: Any,
    *,
    episode_id: str | None = None,
    graph_config: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    keep_messages: bool = False,
    recorder: TurnRecorder | None = None,
    interrupts: InterruptResponder | None = None,
) -> Episode:
    """Run ``graph`` once on ``graph_input`` and return the recorded episode (never raises
    for failures of the graph itself).

    ``recorder``: record into this recorder (e.g. one a caller watches while the episode runs)
    instead of a fresh one. ``timeout_s`` bounds the graph's own time (``GraphClock``): time in
    model calls (queued, generating, held at a batch boundary) does not count. ``interrupts``:
    answers the graph's ``interrupt()`` pauses (the graph gets an in-memory checkpointer if it has
    none); without it a paused episode ends ``interrupted``.
    """
    episode_id = episode_id or (recorder.episode_id if recorder else uuid.uuid4().hex)
    recorder = recorder or TurnRecorder(episode_id, keep_messages=keep_messages)
    track_outside_calls(asyncio.get_running_loop())  # calls made outside the episode's context are counted
    if interrupts is not None:
        graph = interrupts.graph_for(graph)
    graph_clock = GraphClock()
    config = episode_config(graph_config, episode_id, recorder, graph, clock=graph_clock)
    started = time.perf_counter()
    clock = graph_clock.now
    deadline = None if timeout_s is None else clock() + timeout_s
    resumes = 0

    async def play() -> Any:
        """The graph's run, resumed after each pause the responder answers."""
        nonlocal resumes
        output = await graph.ainvoke(graph_input, config)
        while interrupts is not None and pending_interrupts(output) and resumes < interrupts.max_resumes:
            command = await interrupts.answer(graph, config, pending_interrupts(output))
            resumes += 1
            output = await graph.ainvoke(command, config)
        return output

    with recording(recorder):  # the graph's task (and every task it starts) records into it
        task = asyncio.ensure_future(play())
    try:
        while True:
            remaining = None if deadline is None else deadline - clock()
            if remaining is not None and remaining <= 0:
                finished = set()
                break
            finished, _ = await asyncio.wait({task}, timeout=remaining)
            if finished:
                break
    except BaseException:  # the caller cancelled us: stop the graph too
        task.cancel()
        raise
    if not finished:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        episode = recorder.episode(
            "timeout",
            error=(
                f"episode timed out: its graph's own code ran {timeout_s} s (episode_timeout_s; time in model calls "
                "not counted)"
            ),
        )
    elif isinstance(task.exception(), GraphRecursionError):
        limit = config["recursion_limit"]
        episode = recorder.episode("recursion_limit", error=f"recursion limit {limit} reached: {task.exception()}")
    elif isinstance(task.exception(), BlockingCallError):
        raise task.exception()  # type: ignore[misc]
    elif task.exception() is not None:  # any failure of the graph or its model calls
        exc = task.exception()
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        episode = recorder.episode("error", error=detail)
    elif pending_interrupts(task.result()):
        paused = describe(pending_interrupts(task.result()))
        episode = recorder.episode(
            "interrupted",
            error=(
                f"the graph stopped at interrupt({paused}) after {resumes} answers (multi_turn.langgraph.max_resumes)"
                if interrupts is not None
                else f"the graph stopped at interrupt({paused}) and nobody answers it: set multi_turn.langgraph.on_interrupt "
                "to a function answering it (docs/interrupts_and_retries.md)"
            ),
        )
    elif recorder.model_calls == 0:
        episode = recorder.episode(
            "error",
            error=("the graph ended without calling the model: build_graph(model) must use the model it is given"),
        )
    else:
        episode = recorder.episode("ok", output=task.result())
    if interrupts is not None:  # the in-memory checkpoints of the finished episode are of no more use
        await interrupts.forget(graph, config)
    episode.seconds = time.perf_counter() - started
    episode.resumes = resumes
    return episode


async def run_episodes(
    graph: Runnable,
    inputs: Iterable[Any],
    *,
    concurrency: int = 32,
    graph_config: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    keep_messages: bool = False,
    episode_ids: Iterable[str] | None = None,
    on_episode: Callable[[Episode], Awaitable[None] | None] | None = None,
    interrupts: InterruptResponder | None = None,
    keep_discarded: bool = False,
) -> list[Episode]:
    """Run one episode per input, at most ``concurrency`` at a time, in input order.

    ``on_episode`` is called as each episode ends (for progress displays and streaming logs);
    ``interrupts`` answers ``interrupt()`` pauses; ``keep_discarded`` keeps the turns of calls made
    in attempts that then raised (see :class:`TurnRecorder`).
    """
    inputs = list(inputs)
    ids = list(episode_ids) if episode_ids is not None else [uuid.uuid4().hex for _ in inputs]
    if len(ids) != len(inputs):
        raise ValueError(f"got {len(inputs)} inputs but {len(ids)} episode ids")
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(graph_input: Any, episode_id: str) -> Episode:
        async with gate:
            recorder = TurnRecorder(episode_id, keep_messages=keep_messages, keep_discarded=keep_discarded)
            episode = await run_episode(
                graph,
                graph_input,
                episode_id=episode_id,
                graph_config=graph_config,
                timeout_s=timeout_s,
                recorder=recorder,
                interrupts=interrupts,
            )
        if on_episode is not None:
            maybe = on_episode(episode)
            if asyncio.iscoroutine(maybe):
                await maybe
        return episode

    return list(await asyncio.gather(*(one(x, i) for x, i in zip(inputs, ids))))
