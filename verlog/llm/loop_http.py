"""An HTTP client for ``ChatOpenAI`` that works from any number of event loops, one after another.

``langchain_openai`` shares one async HTTP client per base URL across the whole process, and an
async connection belongs to the event loop that opened it. A process that runs two
``asyncio.run(...)`` against one endpoint (two evaluations in a notebook, a test suite, a
script that evaluates after training) gets ``RuntimeError: Event loop is closed`` on the second
from a connection the first left in the pool. verlog's own ``ChatOpenAI`` models
(:func:`verlog.traces.episode_chat_openai`, ``verlog eval --base-url``) are built with
:func:`loop_local_async_client`, which keeps one pool per event loop::

    ChatOpenAI(base_url=url, model="agent", http_async_client=loop_local_async_client())
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

import httpx

__all__ = ["LoopLocalAsyncClient", "loop_local_async_client"]


class LoopLocalAsyncClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose requests go out through a pool of the running event loop's
    own (made on the loop's first request, dropped with the loop).

    It builds requests like any ``httpx.AsyncClient`` made with the same settings; only
    :meth:`send`, which every request goes through, is handed to the loop's pool.
    """

    def __init__(self, **settings: Any):
        super().__init__(**settings)
        self._settings = settings
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # loops in several threads may make their pools at once

    def _pool(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pools.get(loop)
            if pool is None or pool.is_closed:
                pool = self._pools[loop] = httpx.AsyncClient(**self._settings)
            return pool

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        return await self._pool().send(request, **kwargs)

    async def aclose(self) -> None:
        """Close the running loop's pool (the other loops' pools go with their loops)."""
        with self._lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()
        await super().aclose()


def loop_local_async_client(**settings: Any) -> LoopLocalAsyncClient:
    """A :class:`LoopLocalAsyncClient` with the OpenAI SDK's defaults (its connection limits and
    timeout, redirects followed), ``settings`` on top."""
    import openai

    defaults: dict[str, Any] = {
        "timeout": openai.DEFAULT_TIMEOUT,
        "limits": openai.DEFAULT_CONNECTION_LIMITS,
        "follow_redirects": True,
    }
    return LoopLocalAsyncClient(**{**defaults, **settings})
