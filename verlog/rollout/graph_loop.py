"""An event loop in a thread of its own, for the episodes of one env slot.

The slot runner keeps its bookkeeping, the training gate and the engine on its own loop; when its
slots run on threads (``slot_threads="always"``, or after a graph made a blocking call there) each
slot's graph runs on a :class:`GraphLoop`. So a node that blocks its event loop (``model.invoke``,
``model.stream`` or ``model.batch`` inside an ``async def`` node, as graphs written for production
may do) blocks its own slot's episode only, as it would block its own run in production: its
call parks the slot's thread on a thread-safe future while the gate and the engine answer it on
the runner's loop, exactly as a ``def`` node's call does from a worker thread. Were the graphs
on the runner's loop, such a call would wait on the loop that must answer it; were they all on
one other loop, a call held at the batch boundary would stop every other slot from reaching it.

``def`` nodes run in the loop's own thread pool (LangGraph runs them in its loop's default
executor), wide enough for every parallel branch of an episode to hold a call at once; a model
call a node makes outside its episode's context through that pool is counted
(:mod:`verlog.rollout.outside_calls`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

from verlog.rollout.outside_calls import NodeExecutor

__all__ = ["GraphLoop"]

T = TypeVar("T")

#: worker threads of a slot's loop for its ``def`` nodes: parallel sync branches may each park one
#: on a held call (threads are made only when needed)
NODE_THREADS = 16


class GraphLoop:
    """An event loop running in a daemon thread of its own until :meth:`aclose`.

    ``await graph_loop.run(coro)`` runs ``coro`` there and hands its result (or exception) back to
    the awaiting loop; cancelling the awaiting task cancels ``coro``.
    """

    def __init__(self, name: str, node_threads: int = NODE_THREADS):
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._executor = NodeExecutor(max_workers=node_threads, thread_name_prefix=f"{name}-node")
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``await coro`` on this loop, from another loop."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"graph loop {self.name} is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Cancel every task still on the loop and wait for them (at most ``timeout_s``: a node
        blocking the loop's thread for good cannot be stopped; its daemon thread is left behind),
        then stop the loop, its thread and its worker threads."""
        if self._closed:
            return
        self._closed = True

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        try:
            cancelled = asyncio.run_coroutine_threadsafe(cancel_all(), self.loop)
            await asyncio.wait_for(asyncio.wrap_future(cancelled), timeout_s)
        except (asyncio.TimeoutError, RuntimeError):  # a thread blocked for good, or a loop already stopped
            pass
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            pass
        await asyncio.to_thread(self._thread.join, timeout_s)
        try:  # its worker threads end once their nodes have (one blocked for good is left behind)
            await asyncio.wait_for(
                asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True), timeout_s
            )
        except asyncio.TimeoutError:
            pass
        if not self._thread.is_alive():
            self.loop.close()
