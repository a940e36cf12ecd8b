"""``LocalServer``: the start/stop life cycle shared by verlog's aiohttp servers.

Both the SGLang-protocol server (``verlog.backends.sglang_server``) and the OpenAI-compatible
server (``verlog.serve.openai_server``) serve an aiohttp application on ``host``/``port``;
this base class owns listening, the URL, and the async context manager. A subclass only
builds its application in :meth:`app`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web, web_protocol
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

    def connection_handler(self) -> type[web_protocol.RequestHandler] | None:
        """A subclass of aiohttp's connection handler (``RequestHandler``, adding no slots) to
        serve each connection with, e.g. to answer what its HTTP parser refuses otherwise;
        ``None``: aiohttp's own."""
        return None

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
        handler_class = self.connection_handler()
        runner_class = web.AppRunner if handler_class is None else _runner_serving_with(handler_class)
        runner = runner_class(self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
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


def _runner_serving_with(handler_class: type[web_protocol.RequestHandler]) -> type[web.AppRunner]:
    """An ``AppRunner`` whose connections are served by ``handler_class`` (a slot-less subclass
    of aiohttp's ``RequestHandler``): its sites make each connection's handler through
    ``runner.server``, which here hands out aiohttp's own, recast as ``handler_class``."""

    class _Connections:
        def __init__(self, server: web.Server):
            self.server = server

        def __call__(self) -> web_protocol.RequestHandler:
            handler = self.server()
            handler.__class__ = handler_class  # the same layout: only its methods differ
            return handler

        def __getattr__(self, name: str) -> Any:
            return getattr(self.server, name)

    class Runner(web.AppRunner):
        @property
        def server(self) -> Any:
            server = super().server
            return None if server is None else _Connections(server)

    return Runner
