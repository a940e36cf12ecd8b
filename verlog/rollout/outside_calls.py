"""Model calls a graph makes outside its episode's context: answered, never trained, counted.

LangChain finds a call's callbacks (verlog's recorder among them) in the context the call is made
in. ``asyncio.to_thread`` and LangGraph's own ``def`` nodes carry that context into their worker
thread; ``loop.run_in_executor(None, model.invoke, messages)`` in an ``async def`` node does not,
so such a call has no recorder: the engine answers it, and it is not a training turn. The loops
that run episodes (:class:`verlog.rollout.graph_loop.GraphLoop`'s, and the one ``run_episodes``
runs on when it has no executor yet) get a :class:`NodeExecutor` as their default executor: a
function submitted from a node of a recorded episode runs with a LangChain callback handler of
its own (:class:`OutsideCallCounter`) that counts such a call on the episode's recorder
(``uncaptured_calls``) and warns once per node with the fix, without recording it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import warnings
from typing import Any, Callable
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.context import register_configure_hook

from verlog.rollout.recorder import NO_TRAIN_TAG, TurnRecorder, active_recorder

__all__ = ["NodeExecutor", "OutsideCallCounter", "track_outside_calls", "widen_node_executor"]


class OutsideCallCounter(BaseCallbackHandler):
    """Joins the chat-model calls made in a function a node of ``recorder``'s episode handed to
    the loop's executor: each one the recorder did not see itself (the function passed no config
    carrying it) is counted on the recorder as uncaptured, and warned of once per node."""

    run_inline = True
    ignore_chain = True
    ignore_agent = True
    ignore_retriever = True

    def __init__(self, recorder: TurnRecorder, node: str | None):
        self.recorder, self.node = recorder, node
        self._calls: set[UUID] = set()

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, tags: list[str] | None = None, **kwargs: Any
    ) -> None:
        if not (tags and NO_TRAIN_TAG in tags):
            self._calls.add(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def _ended(self, run_id: UUID) -> None:
        if run_id in self._calls:
            self._calls.discard(run_id)
            if self.recorder.count_outside_call(run_id):
                _warn(self.node)


#: the counter of the function running in this context (set by :class:`NodeExecutor`)
_COUNTER: contextvars.ContextVar[OutsideCallCounter | None] = contextvars.ContextVar(
    "verlog_outside_call_counter", default=None
)
register_configure_hook(_COUNTER, inheritable=True)

_warned: set[str | None] = set()
_warned_lock = threading.Lock()


def _warn(node: str | None) -> None:
    with _warned_lock:
        if node in _warned:
            return
        _warned.add(node)
    where = f"node {node!r}" if node else "a node"
    warnings.warn(
        f"{where} made a model call outside its episode's context (loop.run_in_executor does not carry "
        "LangChain's context into its thread): it was answered but is not trained (counted in uncaptured_calls); "
        "use asyncio.to_thread(model.invoke, messages), which carries it, or pass the node's config: "
        "model.invoke(messages, config)",
        RuntimeWarning,
        stacklevel=2,
    )


class NodeExecutor(concurrent.futures.ThreadPoolExecutor):
    """The default executor of a loop that runs episodes: a function submitted from a node of a
    recorded episode runs with an :class:`OutsideCallCounter` for it (in a context of its own, so
    nothing else of the node's context leaks in); any other function runs as it would."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        recorder = active_recorder()
        if recorder is None:
            return super().submit(fn, *args, **kwargs)
        config = var_child_runnable_config.get() or {}
        counter = OutsideCallCounter(recorder, (config.get("metadata") or {}).get("langgraph_node"))
        return super().submit(_run_counted, counter, fn, args, kwargs)

    def widen(self, threads: int) -> None:
        """Allow ``threads`` more worker threads (made only when needed), e.g. for the ``def`` nodes
        of a slot runner's episodes, which may each park a thread on a call held at the boundary."""
        with self._shutdown_lock:
            self._max_workers += threads

    def narrow(self, threads: int) -> None:
        """Give back what :meth:`widen` allowed (threads already made stay until the pool ends)."""
        with self._shutdown_lock:
            self._max_workers = max(1, self._max_workers - threads)


def _run_counted(counter: OutsideCallCounter, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    def run() -> Any:
        _COUNTER.set(counter)
        return fn(*args, **kwargs)

    return contextvars.Context().run(run)


def track_outside_calls(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` a :class:`NodeExecutor` as its default executor, unless it already has a
    default executor (which is then left as it is: its calls go uncounted)."""
    if getattr(loop, "_default_executor", None) is None:
        loop.set_default_executor(NodeExecutor(thread_name_prefix="verlog-node"))


def widen_node_executor(loop: asyncio.AbstractEventLoop, threads: int) -> NodeExecutor | None:
    """The :class:`NodeExecutor` that is ``loop``'s default executor (given one if it has none),
    widened by ``threads``; ``None`` when the loop has a default executor of another kind, whose
    width verlog cannot vouch for."""
    track_outside_calls(loop)
    executor = getattr(loop, "_default_executor", None)
    if not isinstance(executor, NodeExecutor):
        return None
    executor.widen(threads)
    return executor
