"""``LocalServer``: the start/stop life cycle shared by verlog's aiohttp servers.

Both the SGLang-protocol server (``verlog.backends.sglang_server``) and the OpenAI-compatible
server (``verlog.serve.openai_server``) serve an aiohttp application on ``host``/``port``;
this base class owns listening, the URL, and the async context manager. A subclass only
builds its application in :meth:`app`.
"""

from __future__ import annotations

from aiohttp import web
from typing_extensions import Self  # typing.Self is 3.11+

__all__ = ["LocalServer"]


class LocalServer:
    """An aiohttp application served on ``host``:``port`` (``port=0``: a free port, chosen at start)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The application to serve (routes, middlewares)."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The base URL clients use, e.g. ``http://127.0.0.1:40123`` (once started)."""
        if self._runner is None:
            raise RuntimeError("the server is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> Self:
        """Start listening (the chosen port is written back to :attr:`port`)."""
        if self._runner is not None:
            return self
        # handler_cancellation: a request whose client went away stops being served (the engine
        # frees its batch row at the next step), as SGLang and vLLM abort such requests
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]
        self._runner = runner
        return self

    async def stop(self) -> None:
        """Stop listening and cancel the requests still being served."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
