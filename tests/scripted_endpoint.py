"""A scripted OpenAI-compatible chat endpoint, for tests of what verlog sends to an endpoint and
how it copes with what comes back (judges, endpoint evaluations)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from aiohttp import web

from verlog.local_server import LocalServer


class ScriptedChatServer(LocalServer):
    """An OpenAI-compatible ``/v1/chat/completions`` that plays ``script`` one entry per request
    (then answers ``default(body)``), keeping every request body and the most requests in flight.

    Script entries: ``("status", code, headers)``, ``("slow", seconds)`` (then ``default(body)``),
    ``("text", content)`` (an answer with this content), ``("cut", content)`` (the same, cut by
    ``max_tokens``) or a callable ``body -> content`` (or ``body -> message``: a whole assistant message)."""

    def __init__(self, script: list[Any] | None = None, default: Callable[[dict], str] = lambda body: "OK"):
        super().__init__()
        self.script = list(script or [])
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.refuse_response_format = False  # as a server that knows no structured output

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.refuse_response_format and "response_format" in body:
            return web.json_response({"error": {"message": "response_format is not supported"}}, status=400)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            step = self.script.pop(0) if self.script else self.default
            if isinstance(step, tuple) and step[0] == "status":
                return web.json_response(
                    {"error": {"message": f"scripted {step[1]}"}},
                    status=step[1],
                    headers=step[2] if len(step) > 2 else None,
                )
            if isinstance(step, tuple) and step[0] == "slow":
                await asyncio.sleep(step[1])
                content = self.default(body)
            elif isinstance(step, tuple) and step[0] in ("text", "cut"):
                content = step[1]
            else:
                await asyncio.sleep(0.05)  # long enough for concurrent requests to overlap
                content = step(body)
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            # a callable may answer a whole message (tool calls...), else its content
                            "message": content
                            if isinstance(content, dict)
                            else {"role": "assistant", "content": content},
                            "finish_reason": "length" if isinstance(step, tuple) and step[0] == "cut" else "stop",
                        }
                    ],
                }
            )
        finally:
            self.in_flight -= 1
