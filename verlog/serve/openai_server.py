"""An OpenAI-compatible chat server on any verlog engine: a trained checkpoint as a service.

``verlog serve-model CHECKPOINT`` runs it on the embedded engine; in Python::

    server = OpenAIServer(engine, tokenizer, model_name="my-agent")
    async with server:                       # 127.0.0.1, a free port
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused")

    with serve_in_thread(server) as base_url:   # for synchronous clients and scripts
        openai.OpenAI(base_url=base_url, api_key="unused").chat.completions.create(...)

Served: ``POST /v1/chat/completions`` (streaming as server-sent events, Hermes tool calls in
OpenAI's ``tool_calls`` format, ``tool_choice`` auto/none/required/named, ``logprobs``,
``response_format`` json_schema/json_object; a forced call and a JSON format are held to their
schemas by the engine's token mask),
``GET /v1/models``, ``GET /v1/models/{id}`` and ``GET /health``. The answer is produced by the
same code as training: :class:`~verlog.llm.VerlogChatModel` renders the prompt with the
tokenizer's chat template and turns the engine's ids into text and tool calls, so a greedy
request here and a greedy call in a training episode give the same answer.

Bad requests get OpenAI's error JSON with a 4xx status (400 schema / unsupported parameter /
prompt too long / too many messages / JSON nested too deep, 401 API key, 403 an endpoint closed
for want of a key, 404 unknown model or path, 408 body not sent in time, 413 body too large, 415
not JSON, 429 too many requests, with ``Retry-After``, 431 headers too many or too large) and the
server keeps serving.

**Who may do what.** Chat and models: anyone who can connect, or holders of ``api_key``.
Nothing that changes weights or rewards is open anonymously: ``POST /v1/feedback`` needs the API
key or the admin key, ``POST /v1/admin/reload`` the admin key (the API key where no admin key is
set); with no key at all both answer 403 (:meth:`OpenAIServer.access` says it in one line).

**A model that cannot answer is not served.** :meth:`OpenAIServer.check_engine` runs a short
canary (a greedy and a sampled generation; every logprob must be finite): at start
(``check_at_start``) and before a reload swaps weights in. ``/health`` answers 503 ``failing``
while the engine's last generation failed.

A bad, slow or large client cannot stall the others: a request's body is decoded, validated and
its prompt rendered and measured on a worker thread, never on the event loop (``/health`` and
streaming answers go on meanwhile), large bodies on a lane of their own, and a prompt surely
over the limit is refused before it is tokenized whole (:mod:`verlog.serve.admission`); a
connection must send its headers, and then its body, within ``read_timeout_s`` (else it is
closed, or answered 408); when the queue is full a request is refused (429) before its body is
read or parsed.

Production traffic back to training (``serve-model --record``): with a
:class:`~verlog.traces.TraceRecorder` every completion is written to the trace store token-exact
(prompt ids, response ids, logprobs, sampling, model version, latency), filed under the episode
the client names (the ``X-Verlog-Episode`` header, else the request's ``user`` field, else one
episode per completion; the answer carries the episode and the model version in
``X-Verlog-Episode`` / ``X-Verlog-Model-Version``), and the answer is sent once its turn is
committed (unless the recorder has a write-behind window); ``POST /v1/feedback`` attaches a
reward to an episode or a turn later. :meth:`OpenAIServer.swap` (``POST /v1/admin/reload`` with a reloader)
puts a new checkpoint in service without dropping requests: requests in flight finish on the
weights they started on, then the old engine is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from aiohttp import web, web_protocol
from langchain_core.messages import HumanMessage

from verlog.backends.base import Engine, EngineError, Generation, SamplingParams, TokenDelta
from verlog.llm.chat_model import VerlogChatModel
from verlog.llm.prompt import PromptRenderer
from verlog.llm.tool_calls import TOOL_CALL_OPEN
from verlog.local_server import LocalServer
from verlog.serve import openai_protocol as proto
from verlog.serve.admission import Admission, PromptBound
from verlog.serve.openai_protocol import APIError
from verlog.traces.recorder import TraceRecorder
from verlog.traces.records import EPISODE_HEADER, VERSION_HEADER, TracedTurn
from verlog.traces.store import UnknownEpisodeError

log = logging.getLogger(__name__)


#: the Content-Encodings a request body may have (aiohttp decodes them; the size limit holds
#: for the decoded body)
_BODY_ENCODINGS = frozenset({"identity", "gzip", "deflate"})


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how many are served at once.

    Args:
        max_body_bytes: largest request body (413 above it).
        max_prompt_tokens: longest rendered prompt (400 ``context_length_exceeded`` above it);
            ``None``: the engine's context length minus one.
        max_tokens_cap: largest ``max_tokens`` a request may ask (400 above it).
        default_max_tokens: the response budget when a request sets none.
        max_concurrency: requests generating at once (the engine batches them together).
        max_queue: requests allowed to wait (for their prompt to be rendered, for a generation
            slot) beyond those generating; more get 429 with ``Retry-After``.
        large_body_bytes: bodies larger than this are prepared on a lane of their own (one worker
            thread), so that they cannot hold up the small requests' workers.
        max_large_queue: large bodies admitted at once (included in ``max_queue``); more large
            bodies get 429 while small requests are still served.
        request_timeout_s: a generation still running after this long is stopped (504).
        max_messages: most messages in one request (400 above it, checked before rendering).
        read_timeout_s: a connection must send a request's headers within this long of opening
            (or of its previous answer: idle keep-alive connections are closed then too), and
            the body within this long of the headers (408, connection closed).
        max_header_bytes: the most bytes a request's headers may take, names and values (431
            above it).
        max_headers: the most header fields a request may have (431 above it). The HTTP parser
            itself refuses (400) a header line over 8,190 bytes or over 4x this many fields
            before the request reaches the server.
    """

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None
    max_tokens_cap: int = 2048
    default_max_tokens: int = 256
    max_concurrency: int = 64
    max_queue: int = 256
    request_timeout_s: float | None = 600.0
    max_messages: int = 2048
    read_timeout_s: float = 15.0
    large_body_bytes: int = 64 << 10
    max_large_queue: int = 8
    max_header_bytes: int = 32 << 10
    max_headers: int = 100

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_tokens_cap",
            "default_max_tokens",
            "max_concurrency",
            "max_messages",
            "large_body_bytes",
            "max_large_queue",
            "max_header_bytes",
            "max_headers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"ServerLimits.max_queue must be >= 0, got {self.max_queue}")
        if not self.read_timeout_s > 0:
            raise ValueError(f"ServerLimits.read_timeout_s must be > 0, got {self.read_timeout_s}")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"ServerLimits.default_max_tokens ({self.default_max_tokens}) exceeds max_tokens_cap "
                f"({self.max_tokens_cap})"
            )


class _Policy:
    """A model version in service: its engine, its id, and the requests generating on it (a
    version swapped out is closed once they have finished)."""

    def __init__(self, engine: Engine, version: str):
        self.engine, self.version = engine, version
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


#: what a server's reloader returns: the new engine (``None`` when the newest version is the one
#: in service), its tokenizer, its version id
Reloaded = tuple["Engine | None", Any, str]


class _TokenStream:
    """An engine call whose tokens arrive as they are chosen (``engine.stream``: all at the end
    for engines that cannot report them earlier). Iterate for batches of ``(id, logprob)``; then
    ``generation`` holds the whole generation."""

    def __init__(self, engine: Engine, prompt_ids: list[int], sampling: SamplingParams):
        self._items = engine.stream(prompt_ids, sampling)
        self._generation: Generation | None = None

    @property
    def generation(self) -> Generation:
        if self._generation is None:
            raise EngineError("the engine's stream ended without its generation")
        return self._generation

    async def __aiter__(self) -> AsyncIterator[list[tuple[int, float]]]:
        async for item in self._items:
            if isinstance(item, TokenDelta):
                if item.token_ids:
                    yield list(zip(item.token_ids, item.logprobs))
            else:
                self._generation = item
        _ = self.generation  # raises if the stream ended without one

    async def aclose(self) -> None:
        """Stop the generation (the client went away, the time limit passed)."""
        await self._items.aclose()


@dataclass(frozen=True)
class _PreparedCall:
    """A validated request, ready for the engine: its prompt ids, the answer text they prefill,
    its sampling settings (constraint included), whether tool calls are parsed."""

    request: proto.ChatCompletionRequest
    prompt_ids: list[int]
    prefix: str
    sampling: SamplingParams
    has_tools: bool
    #: the request's messages as sent (kept for the trace store's ``full`` privacy mode)
    messages: Any = None


def _held_back(text: str, markers: list[str]) -> int:
    """Length of the longest end of ``text`` that could be the start of one of ``markers``."""
    held = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), held, -1):
            if text.endswith(marker[:k]):
                held = k
                break
    return held


class OpenAIServer(LocalServer):
    """OpenAI's chat-completions API in front of a verlog :class:`Engine`.

    Args:
        engine: produces the tokens (the embedded engine, a scripted engine in tests, ...).
        tokenizer: the model's tokenizer, with the chat template used in training.
        model_name: the id clients send as ``model`` (others get 404).
        api_key: if set, requests need ``Authorization: Bearer <api_key>`` (``/health`` does not).
        admin_key: the key of ``POST /v1/admin/reload`` (feedback takes it too); ``None``: the
            API key. With neither key, feedback and reload are closed (403).
        limits: request limits (see :class:`ServerLimits`).
        chat_template_kwargs: as in training's ``multi_turn.chat_template_kwargs``.
        host, port: where :meth:`start` listens (``port=0``: a free port, see :attr:`port`).
        model_version: the id of the weights served (a checkpoint id), recorded with each trace.
        recorder: records every completion in a trace store (``None``: nothing is recorded).
        reloader: loads the newest checkpoint of what is served (``POST /v1/admin/reload``);
            ``None``: the endpoint answers 404.
        check_at_start: run :meth:`check_engine` on ``engine`` when the server starts (it does
            not start if the model cannot answer).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model_name: str = "verlog",
        api_key: str | None = None,
        limits: ServerLimits | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model_version: str | None = None,
        recorder: TraceRecorder | None = None,
        reloader: Callable[[], Reloaded] | None = None,
        admin_key: str | None = None,
        check_at_start: bool = False,
    ):
        super().__init__(host, port)
        self._policy = _Policy(engine, model_version or model_name)
        self.recorder = recorder
        self.reloader = reloader
        self._swapping = asyncio.Lock()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.api_key = api_key or None
        self.admin_key = admin_key or None
        self.check_at_start = check_at_start
        #: why the engine's last generation failed (``None``: it answered): ``/health`` reports it
        self.failure: str | None = None
        #: while failing, ``/health`` runs the canary again at most this often (a server taken
        #: out of rotation for its 503 gets no traffic that could show it has recovered)
        self.health_recheck_s = 5.0
        self._rechecked = -math.inf
        self._rechecking = asyncio.Lock()
        self.limits = limits or ServerLimits()
        self.chat_model = VerlogChatModel(
            engine=engine,
            tokenizer=tokenizer,
            model_name=model_name,
            chat_template_kwargs=dict(chat_template_kwargs or {}),
            max_tokens=self.limits.default_max_tokens,
        )
        context = getattr(engine, "max_context", None)
        self.max_context: int | None = context if isinstance(context, int) and context < 1 << 30 else None
        self.max_prompt_tokens = self.limits.max_prompt_tokens or (self.max_context - 1 if self.max_context else None)
        #: places, lanes (where bodies are prepared, off the event loop) and generation slots
        self._admission = Admission(
            self.limits.max_concurrency,
            self.limits.max_queue,
            large_body_bytes=self.limits.large_body_bytes,
            large_waiting=self.limits.max_large_queue,
        )
        self._renderer = PromptRenderer(tokenizer, chat_template_kwargs)
        self._prompt_bound = PromptBound(tokenizer, self.max_prompt_tokens) if self.max_prompt_tokens else None
        self._token_bytes = proto.TokenBytes(tokenizer)
        self._running = False
        self.created = proto.now()
        #: counters: requests answered, by HTTP status
        self.responses: dict[int, int] = {}

    # ------------------------------------------------------------------ lifecycle
    @property
    def engine(self) -> Engine:
        """The engine of the model version now in service (new requests go to it)."""
        return self._policy.engine

    @property
    def model_version(self) -> str:
        """The id of the weights now in service."""
        return self._policy.version

    @property
    def base_url(self) -> str:
        """What OpenAI clients take as ``base_url``: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    async def start(self) -> "OpenAIServer":
        if self.check_at_start:
            await self.check_engine(self.engine, self.model_version)
        self._admission.start()
        self._running = True
        await super().start()
        return self

    async def stop(self) -> None:
        self._running = False
        await super().stop()
        self._admission.stop()

    def app(self) -> web.Application:
        """The aiohttp application (routes and error handling)."""
        timeout = self.limits.read_timeout_s
        app = web.Application(
            client_max_size=self.limits.max_body_bytes,
            middlewares=[self._errors, self._header_bounds],
            # aiohttp closes a connection whose handler is still waiting for a request's headers
            # when its keep-alive time is up, counted from the connection's start or its last
            # answer: the headers' read timeout. A body left unread after an early answer is
            # drained for at most as long.
            handler_args={
                "keepalive_timeout": timeout,
                "lingering_time": timeout,
                # the parser's own bound, past which it answers 400 itself; below it the
                # server's limits answer 431 (_header_bounds)
                "max_headers": 4 * self.limits.max_headers,
            },
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/feedback", self._feedback)
        app.router.add_post("/v1/admin/reload", self._reload)
        return app

    # ------------------------------------------------------------------ plumbing
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every failure becomes OpenAI's error JSON; nothing stops the server."""
        try:
            response = await handler(request)
        except APIError as exc:
            response = web.json_response(exc.body(), status=exc.status, headers=exc.headers)
            if exc.close:  # the rest of the body may never come, or cannot be read: answer, then hang up
                response.force_close()
                await response.prepare(request)
                await response.write_eof()
                if request.transport is not None:
                    request.transport.close()
        except web.HTTPRequestEntityTooLarge:
            response = web.json_response(
                proto.error_body(
                    f"the request body exceeds this server's limit of {self.limits.max_body_bytes} bytes",
                    type="invalid_request_error",
                    code="request_too_large",
                ),
                status=413,
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
            message = f"{request.method} {request.path}: {exc.reason}"
            if exc.status == 404:
                message += " (served: POST /v1/chat/completions, GET /v1/models, GET /health, POST /v1/feedback)"
            response = web.json_response(proto.error_body(message, type=kind), status=exc.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a bug or an engine failure: report it, keep serving
            log.exception("request %s %s failed", request.method, request.path)
            response = web.json_response(
                proto.error_body(f"internal server error: {type(exc).__name__}: {exc}", type="server_error"),
                status=500,
            )
        self.responses[response.status] = self.responses.get(response.status, 0) + 1
        return response

    @web.middleware
    async def _header_bounds(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """431 for a request whose headers are too many or too large (before anything else)."""
        count = len(request.raw_headers)
        size = sum(len(name) + len(value) + 4 for name, value in request.raw_headers)
        if count > self.limits.max_headers or size > self.limits.max_header_bytes:
            raise APIError(
                431,
                f"the request's headers ({count} fields, {size} bytes) exceed this server's limits "
                f"({self.limits.max_headers} fields, {self.limits.max_header_bytes} bytes)",
                code="request_header_fields_too_large",
                close=True,
            )
        return await handler(request)

    def _bearer(self, request: web.Request) -> str:
        given = request.headers.get("Authorization", "")
        return given[7:].strip() if given[:7].lower() == "bearer " else ""

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None:
            return
        token = self._bearer(request)
        if not token or not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(
                401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )

    def _feedback_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.api_key, self.admin_key) if k)

    def _reload_keys(self) -> tuple[str, ...]:
        return (self.admin_key,) if self.admin_key else ((self.api_key,) if self.api_key else ())

    def _check_key(self, request: web.Request, keys: tuple[str, ...], endpoint: str, holders: str) -> None:
        """An endpoint that changes rewards or weights: closed (403) without a key for it, else
        only for a request bearing one (401)."""
        if not keys:
            raise APIError(
                403,
                f"{endpoint} is closed: this server has no key for it (start it with --admin-key "
                "or --api-key, or $VERLOG_ADMIN_KEY / $VERLOG_API_KEY)",
                type="permission_error",
                code="endpoint_closed",
            )
        token = self._bearer(request).encode()
        if not token or not any(hmac.compare_digest(token, k.encode()) for k in keys):
            raise APIError(
                401,
                f"Incorrect or missing key for {endpoint}: send 'Authorization: Bearer <{holders}>'",
                code="invalid_api_key",
            )

    def access(self) -> str:
        """Who may use what on this server, in one line (``serve-model`` prints it at start)."""
        chat = "API key" if self.api_key else f"anyone who can connect to {self.host}"
        if self.recorder is None:
            feedback = "not served (no --record)"
        else:
            feedback = (
                " or ".join(n for n, k in (("API key", self.api_key), ("admin key", self.admin_key)) if k)
                or "closed (no key)"
            )
        if self.reloader is None:
            reload = "not served"
        else:
            reload = "admin key" if self.admin_key else ("API key" if self.api_key else "closed (no key)")
        return f"chat and models: {chat}; feedback: {feedback}; reload: {reload}"

    async def _read_body(self, request: web.Request) -> bytes:
        """The raw body: JSON only (415), as is or gzip/deflate-compressed (415 for other
        encodings, 400 when it does not decode), within the size limit once decoded (413), sent in
        time (408)."""
        if (
            request.headers.get("Content-Type") is not None
            and request.content_type != "application/json"
            and not request.content_type.endswith("+json")
        ):
            raise APIError(
                415,
                f"unsupported Content-Type '{request.content_type}': send the request as JSON "
                "with 'Content-Type: application/json'",
                code="unsupported_media_type",
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in _BODY_ENCODINGS:
            raise APIError(
                415,
                f"unsupported Content-Encoding '{encoding[:40]}': send the body as is or with "
                f"{', '.join(sorted(_BODY_ENCODINGS - {'identity'}))}",
                code="unsupported_media_type",
                close=True,
            )
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.limits.max_body_bytes, actual_size=length)
        try:
            return await asyncio.wait_for(request.read(), self.limits.read_timeout_s)
        except asyncio.TimeoutError:
            raise APIError(
                408,
                f"the request body did not arrive within {self.limits.read_timeout_s} s (--read-timeout-s)",
                code="request_timeout",
                close=True,
            ) from None
        except web_protocol.RequestPayloadError as exc:  # a body its Content-Encoding does not decode
            encoding = request.headers.get("Content-Encoding", "")
            raise APIError(
                400,
                f"the request body cannot be decoded as its Content-Encoding "
                f"'{encoding[:40]}' says: {str(exc).strip().splitlines()[-1].strip()[:200]}",
                code="bad_content_encoding",
                close=True,
            ) from None

    # ------------------------------------------------------------------ endpoints
    async def _health(self, request: web.Request) -> web.Response:
        """200 ``ok`` while the engine answers; 503 ``failing`` (with the error) while its last
        generation failed, so a load balancer or supervisor can tell. While failing, the canary
        is run again (at most every ``health_recheck_s``): once it passes, the server is ok."""
        if (
            self.failure is not None
            and not self._rechecking.locked()
            and time.monotonic() - self._rechecked >= self.health_recheck_s
        ):
            async with self._rechecking:
                self._rechecked = time.monotonic()
                try:
                    await self.check_engine(self.engine, self.model_version)
                    self.failure = None
                except UnservableModelError as exc:
                    self.failure = str(exc)
        body = {
            "status": "ok" if self.failure is None else "failing",
            "model": self.model_name,
            "version": self.model_version,
            "generating": self._admission.active,
            "waiting": self._admission.queued,
        }
        if self.failure is not None:
            body["error"] = self.failure
        if self.recorder is not None:
            body["recording"] = {
                "written": self.recorder.written,
                "dropped": self.recorder.dropped,
                "late": self.recorder.late,
                "durable": self.recorder.durable,
            }
        return web.json_response(body, status=200 if self.failure is None else 503)

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "verlog"}

    async def _models(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        name = request.match_info["model"]
        if name != self.model_name:
            raise self._unknown_model(name)
        return web.json_response(self._model_card())

    def _unknown_model(self, name: str) -> APIError:
        return APIError(
            404,
            f"The model '{name}' does not exist on this server; it serves '{self.model_name}' (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self._check_auth(request)
        self._admission.check(self._admission.lane(request.content_length))  # 429 now: nothing read or parsed yet
        raw = await self._read_body(request)
        lane = self._admission.lane(len(raw))
        async with self._admission.admit(lane):
            if lane.pool is None or not self._running:
                raise APIError(503, "the server is stopping", type="server_error")
            async with lane.turn():
                call = await asyncio.get_running_loop().run_in_executor(lane.pool, self._prepare, raw)
            req, prompt_ids, prefix, sampling, has_tools = (
                call.request,
                call.prompt_ids,
                call.prefix,
                call.sampling,
                call.has_tools,
            )
            if sampling.constraint is not None:  # a schema the engine cannot compile is the request's fault
                try:
                    await asyncio.to_thread(self.engine.validate_constraint, sampling.constraint)
                except EngineError as exc:
                    param = "response_format" if req.response_format else "regex" if req.regex is not None else "tools"
                    raise APIError(400, str(exc), param=param) from None
            episode = self._episode_of(request, req)
            async with self._admission.slot():
                policy, started = self._policy, time.perf_counter()
                policy.enter()
                try:
                    if req.stream:
                        return await self._stream(
                            request,
                            req,
                            prompt_ids,
                            prefix,
                            sampling,
                            has_tools,
                            policy=policy,
                            episode=episode,
                            messages=call.messages,
                        )
                    generation = await self._generate(prompt_ids, sampling, policy.engine)
                finally:
                    policy.leave()
        text = self._answer_text(generation, sampling, prefix)
        await self._record(
            episode, prompt_ids, generation, sampling, policy, time.perf_counter() - started, text, call.messages
        )
        message = self.chat_model.to_message(prompt_ids, generation, sampling, has_tools=has_tools, prefix=prefix)
        content, calls = proto.answer_parts(message, text)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": content if content or not calls else None,
                **({"tool_calls": calls} if calls else {}),
            },
            "logprobs": None,
            "finish_reason": proto.finish_reason(bool(calls), generation.finish_reason),
        }
        if req.logprobs:
            choice["logprobs"] = {
                "content": proto.token_logprobs(self._token_bytes, generation.token_ids, generation.logprobs)
            }
        return web.json_response(
            {
                "id": proto.completion_id(),
                "object": "chat.completion",
                "created": proto.now(),
                "model": self.model_name,
                "choices": [choice],
                "usage": proto.usage(len(prompt_ids), len(generation.token_ids)),
            },
            headers=self._trace_headers(episode, policy),
        )

    def _prepare(self, raw: bytes) -> _PreparedCall:
        """Decode, validate and render a request body (on a worker thread: its cost grows with
        the body, which must not hold up the event loop); raises :class:`APIError`."""
        body = proto.decode_body(raw, max_messages=self.limits.max_messages)
        req = proto.parse_request(body)
        if req.model != self.model_name:
            raise self._unknown_model(req.model)
        messages = proto.to_langchain_messages(req)
        tools = body["tools"] if req.tools else None  # as sent: the template renders them verbatim
        response_format = req.response_format.model_dump(exclude_none=True) if req.response_format else None
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, proto.NamedToolChoice) else req.tool_choice
        try:  # a forced tool call or a JSON response format is held to its schema by a token mask
            if self._prompt_bound is not None:  # a prompt surely too long is refused before it is tokenized whole
                self._prompt_bound.check(self._renderer.render_text(messages, tools if choice != "none" else None))
            plan = self.chat_model.plan_call(
                messages, tools, choice, response_format, {"regex": req.regex} if req.regex is not None else None
            )
        except APIError:
            raise
        except ValueError as exc:  # tool_choice naming no offered tool, a format that cannot be had
            param = "response_format" if response_format else "regex" if req.regex is not None else "tool_choice"
            raise APIError(400, str(exc), param=param) from None
        except Exception as exc:  # the chat template refused the conversation (jinja's errors)
            raise APIError(
                400, f"the model's chat template cannot render these messages: {exc}", param="messages"
            ) from None
        sampling = dataclasses.replace(self._sampling(req, len(plan.prompt_ids)), constraint=plan.constraint)
        kept = body["messages"] if self.recorder is not None and self.recorder.store.policy.privacy == "full" else None
        return _PreparedCall(
            req, plan.prompt_ids, plan.prefix, sampling, bool(tools) and req.tool_choice != "none", kept
        )

    def _answer_text(self, generation: Generation, sampling: SamplingParams, prefix: str) -> str:
        """The answer exactly as the model wrote it (forced prefix, no end/stop tokens)."""
        return prefix + self.chat_model.answer_text(
            generation.token_ids, sampling, finished=generation.finish_reason == "stop"
        )

    def _sampling(self, req: proto.ChatCompletionRequest, prompt_tokens: int) -> SamplingParams:
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            raise APIError(
                400,
                f"the prompt is {prompt_tokens} tokens long; this server accepts at most {self.max_prompt_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if asked is not None and asked > self.limits.max_tokens_cap:
            raise APIError(
                400,
                f"'{param}' is too large: {asked}; this server allows at most {self.limits.max_tokens_cap}",
                param=param,
            )
        budget = asked if asked is not None else self.limits.default_max_tokens
        if self.max_context is not None and prompt_tokens + budget > self.max_context:
            if asked is not None:
                raise APIError(
                    400,
                    f"the prompt ({prompt_tokens} tokens) plus '{param}' ({asked}) exceeds the "
                    f"model's context of {self.max_context} tokens",
                    param=param,
                    code="context_length_exceeded",
                )
            budget = self.max_context - prompt_tokens
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        options: dict[str, Any] = {"max_tokens": budget}
        for name in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(req, name)
            if value is not None:
                options[name] = value
        try:
            return self.chat_model.sampling_params(stop, **options)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams, engine: Engine) -> Generation:
        try:
            generation = await asyncio.wait_for(engine.generate(prompt_ids, sampling), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            raise APIError(
                504,
                f"the generation did not finish within {self.limits.request_timeout_s} s",
                type="server_error",
                code="timeout",
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine's own error, or a model that cannot sample (NaN weights)
            raise self._engine_failed(exc) from None
        self.failure = None
        return generation

    def _engine_failed(self, exc: BaseException) -> APIError:
        """Note that the engine failed (``/health`` says so until it answers again) and the 500 to send."""
        what = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
        self.failure = f"the engine failed: {' '.join(what.split())[:500]}"
        log.error("generation failed: %s", what)
        return APIError(500, self.failure, type="server_error")

    async def check_engine(self, engine: Engine, version: str) -> None:
        """A canary before ``engine`` serves: a greedy and a sampled 4-token answer to a short
        prompt, each logprob finite. Raises :class:`UnservableModelError` naming ``version`` and
        what went wrong (weights with NaN or inf, a model that cannot sample)."""
        prompt = self.chat_model.plan_call([HumanMessage("Say hello.")]).prompt_ids
        for temperature in (0.0, 1.0):
            sampling = SamplingParams(temperature=temperature, max_new_tokens=4, seed=0)
            try:
                generation = await asyncio.wait_for(engine.generate(prompt, sampling), self.limits.request_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise UnservableModelError(
                    f"model version {version!r} cannot answer a canary request: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                ) from None
            bad = [lp for lp in generation.logprobs if not math.isfinite(lp) or lp > 1e-6]
            if bad or any(i < 0 for i in generation.token_ids):
                raise UnservableModelError(
                    f"model version {version!r} answers a canary request with invalid "
                    f"logprobs ({bad[:3]}): its weights are not fit to serve (NaN or inf?)"
                )

    # ------------------------------------------------------------------ traces, feedback, swaps
    def _episode_of(self, request: web.Request, req: proto.ChatCompletionRequest) -> str | None:
        """The episode a recorded completion is filed under: the client's ``X-Verlog-Episode``
        header, else its ``user`` field, else a new one of its own (``None`` when not recording)."""
        if self.recorder is None:
            return None
        named = request.headers.get(EPISODE_HEADER) or req.user
        if named is not None and (not 0 < len(named) <= 256 or "\x00" in named):
            raise APIError(
                400,
                f"the episode id ({EPISODE_HEADER} or 'user') must be 1 to 256 characters, without NUL",
                param="user",
            )
        return named or proto.completion_id()

    def _trace_headers(self, episode: str | None, policy: _Policy) -> dict[str, str]:
        headers = {VERSION_HEADER: policy.version}
        if episode is not None:
            headers[EPISODE_HEADER] = episode
        return headers

    async def _record(
        self,
        episode: str | None,
        prompt_ids: list[int],
        generation: Generation,
        sampling: SamplingParams,
        policy: _Policy,
        latency_s: float,
        text: str,
        messages: Any,
    ) -> None:
        """Hand the turn to the recorder and, unless it writes behind, wait until it is committed:
        the answer is sent after (a failed write is logged and counted; the answer still goes)."""
        if self.recorder is None or episode is None:
            return
        written = self.recorder.submit(
            TracedTurn(
                episode_id=episode,
                turn_index=-1,
                prompt_ids=list(prompt_ids),
                response_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs),
                model_version=policy.version,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                constraint=sampling.constraint.kind if sampling.constraint is not None else None,
                finish_reason=generation.finish_reason,
                latency_s=latency_s,
                created=time.time(),
                response_text=text,
                messages=messages,
                info=_sampling_info(sampling),
            )
        )
        if written is not None and self.recorder.durable:
            try:  # a store that hangs (a lost database connection) must not hang the traffic itself
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(written)), self.recorder.wait_s)
            except asyncio.TimeoutError:
                self.recorder.late += 1
                log.warning(
                    "turn of episode %s not written within %s s: answered before it is recorded",
                    episode,
                    self.recorder.wait_s,
                )

    async def _feedback(self, request: web.Request) -> web.Response:
        """``POST /v1/feedback``: ``{"episode_id", "reward", "success"?, "info"?, "turn"?}``.

        Never waits for the recorder: a completion is answered once its turn is committed, so
        the turns a client was answered are in the store when it sends feedback on them."""
        self._check_key(request, self._feedback_keys(), "POST /v1/feedback", "API key or admin key")
        if self.recorder is None:
            raise APIError(404, "this server does not record traces (start it with --record)", code="not_recording")
        feedback = proto.parse_feedback(proto.decode_body(await self._read_body(request)))
        store = self.recorder.store

        def attach() -> None:
            store.add_feedback(
                feedback.episode_id,
                feedback.reward,
                success=feedback.success,
                info=feedback.info,
                turn_index=feedback.turn,
            )

        try:
            await asyncio.to_thread(attach)
        except UnknownEpisodeError as exc:
            raise APIError(
                404, str(exc), param="episode_id" if feedback.turn is None else "turn", code="episode_not_found"
            ) from None
        return web.json_response({"object": "feedback", "episode_id": feedback.episode_id, "turn": feedback.turn})

    async def _reload(self, request: web.Request) -> web.Response:
        """``POST /v1/admin/reload``: put the newest checkpoint of what is served in service."""
        self._check_key(
            request, self._reload_keys(), "POST /v1/admin/reload", "admin key" if self.admin_key else "API key"
        )
        if self.reloader is None:
            raise APIError(404, "this server has no checkpoint to reload from", code="not_reloadable")
        async with self._swapping:
            try:
                engine, tokenizer, version = await asyncio.to_thread(self.reloader)
            except (FileNotFoundError, ValueError) as exc:  # no checkpoint yet, one the loader refuses
                raise APIError(409, f"cannot reload: {exc}", code="reload_failed") from None
            if version == self.model_version or engine is None:
                if engine is not None:
                    await asyncio.to_thread(_close_engine, engine)
                return web.json_response({"object": "reload", "version": version, "swapped": False})
            try:  # the new weights answer a canary before any request sees them
                await self.check_engine(engine, version)
            except UnservableModelError as exc:
                await asyncio.to_thread(_close_engine, engine)
                raise APIError(
                    409, f"cannot reload: {exc}; still serving {self.model_version!r}", code="reload_failed"
                ) from None
            try:
                previous = await self.swap(engine, version, tokenizer=tokenizer)
            except ValueError as exc:
                await asyncio.to_thread(_close_engine, engine)
                raise APIError(409, str(exc), code="incompatible_checkpoint") from None
        return web.json_response({"object": "reload", "version": version, "previous": previous, "swapped": True})

    async def swap(self, engine: Engine, version: str, *, tokenizer: Any = None, close_old: bool = True) -> str:
        """Serve ``engine`` (model version ``version``) from now on; returns the version it replaces.

        New requests go to ``engine`` at once; requests in flight finish on the old one, which is
        then closed (``close_old``). The new model must share the served tokenizer's vocabulary
        and chat template (a ``ValueError`` otherwise): prompts are rendered once, for both.
        """
        if tokenizer is not None and not _same_tokenizer(tokenizer, self.tokenizer):
            raise ValueError(
                f"version {version!r} has another tokenizer (vocabulary or chat template) than the "
                f"served {self.model_version!r}: serve it with its own server"
            )
        old, self._policy = self._policy, _Policy(engine, version)
        self.chat_model.engine = engine
        log.info(
            "model version %s in service (was %s; %d requests finishing on it)", version, old.version, old.in_flight
        )
        if close_old:
            asyncio.get_running_loop().create_task(self._retire(old))
        return old.version

    async def _retire(self, old: _Policy) -> None:
        await old.idle.wait()
        await asyncio.to_thread(_close_engine, old.engine)

    # ------------------------------------------------------------------ streaming
    def _streamable(self, text: str, sampling: SamplingParams, has_tools: bool) -> str:
        """The part of the answer so far that is sure to be in the final content."""
        markers = list(sampling.stop)
        for s in sampling.stop:  # a stop string ends the content (the engine stops soon after)
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        if has_tools:
            cut = text.find(TOOL_CALL_OPEN)
            if cut >= 0:
                text = text[:cut]
            markers.append(TOOL_CALL_OPEN)
        text = text[: len(text) - _held_back(text, markers)]
        text = text.rstrip("\ufffd")  # an incomplete UTF-8 character
        return text.rstrip() if has_tools else text  # content before a tool call is stripped

    async def _stream(
        self,
        request: web.Request,
        req: proto.ChatCompletionRequest,
        prompt_ids: list[int],
        prefix: str,
        sampling: SamplingParams,
        has_tools: bool,
        *,
        policy: _Policy,
        episode: str | None,
        messages: Any,
    ) -> web.StreamResponse:
        cid, created, name = proto.completion_id(), proto.now(), self.model_name
        want_logprobs = bool(req.logprobs)
        started = time.perf_counter()
        stream = _TokenStream(policy.engine, prompt_ids, sampling)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **self._trace_headers(episode, policy),
            }
        )
        ids: list[int] = []
        lps: list[float] = []
        sent, reported = "", 0

        async def emit(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
            await response.write(f"data: {data}\n\n".encode())

        def logprobs_since() -> list[dict[str, Any]] | None:
            nonlocal reported
            if not want_logprobs:
                return None
            out = proto.token_logprobs(self._token_bytes, ids[reported:], lps[reported:])
            reported = len(ids)
            return out

        async def pump() -> None:
            nonlocal sent
            async for batch in stream:
                for token, logprob in batch:
                    ids.append(token)
                    lps.append(logprob)
                text = prefix + self.chat_model.answer_text(ids, sampling, finished=False)
                ready = self._streamable(text, sampling, has_tools)
                if len(ready) > len(sent) and ready.startswith(sent):
                    delta, sent = ready[len(sent) :], ready
                    await emit(proto.chunk(cid, created, name, {"content": delta}, logprobs=logprobs_since()))

        try:
            await response.prepare(request)
            await emit(proto.chunk(cid, created, name, {"role": "assistant", "content": ""}))
            await asyncio.wait_for(pump(), self.limits.request_timeout_s)
        except (asyncio.CancelledError, ConnectionResetError):
            await stream.aclose()
            raise
        except Exception as exc:  # a timeout, the engine's error, a model that cannot sample
            await stream.aclose()
            message = (
                f"the generation did not finish within {self.limits.request_timeout_s} s"
                if isinstance(exc, asyncio.TimeoutError)
                else self._engine_failed(exc).message
            )
            await emit(proto.error_body(message, type="server_error"))
            await emit("[DONE]")
            await response.write_eof()
            return response
        generation = stream.generation
        self.failure = None
        text = self._answer_text(generation, sampling, prefix)
        # the turn is committed before the answer's last chunks: a client that saw [DONE] was recorded
        await self._record(
            episode, prompt_ids, generation, sampling, policy, time.perf_counter() - started, text, messages
        )
        message = self.chat_model.to_message(prompt_ids, generation, sampling, has_tools=has_tools, prefix=prefix)
        content, calls = proto.answer_parts(message, text)
        rest = content[len(sent) :] if content.startswith(sent) else ""
        if rest or (want_logprobs and reported < len(ids)):
            await emit(proto.chunk(cid, created, name, {"content": rest}, logprobs=logprobs_since()))
        for index, call in enumerate(calls):
            await emit(proto.chunk(cid, created, name, {"tool_calls": [{"index": index, **call}]}))
        await emit(
            proto.chunk(cid, created, name, {}, finish=proto.finish_reason(bool(calls), generation.finish_reason))
        )
        if req.stream_options is not None and req.stream_options.include_usage:
            await emit(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": name,
                    "choices": [],
                    "usage": proto.usage(len(prompt_ids), len(generation.token_ids)),
                }
            )
        await emit("[DONE]")
        await response.write_eof()
        return response


class UnservableModelError(ValueError):
    """A model version fails its canary (:meth:`OpenAIServer.check_engine`): it is not served."""


def _sampling_info(sampling: SamplingParams) -> dict[str, Any]:
    """The rest of a turn's sampling, kept beside it: the budget, the seed and stop strings if any."""
    info: dict[str, Any] = {"max_tokens": sampling.max_new_tokens}
    if sampling.seed is not None:
        info["seed"] = sampling.seed
    if sampling.stop:
        info["stop"] = list(sampling.stop)
    return info


def _close_engine(engine: Engine) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def _same_tokenizer(a: Any, b: Any) -> bool:
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


# ---------------------------------------------------------------------------------- running it
@contextlib.contextmanager
def serve_in_thread(server: OpenAIServer, *, ready_timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``server`` on its own event loop in a background thread; yields its ``base_url``.

    For synchronous clients (``openai.OpenAI``, ``ChatOpenAI.invoke``) and scripts. The engine
    must accept calls from another event loop (verlog's engines do).
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=run, name="verlog-openai-server", daemon=True)
    thread.start()
    if not started.wait(ready_timeout_s):
        raise RuntimeError(f"the server did not start within {ready_timeout_s} s")
    if failure:
        raise failure[0]
    try:
        yield server.base_url
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


async def serve_forever(server: OpenAIServer, on_start: Callable[[], None] | None = None) -> None:
    """Start ``server``, call ``on_start()``, serve until cancelled."""
    async with server:
        if on_start is not None:
            on_start()
        await asyncio.Event().wait()


def run_server(server: OpenAIServer, on_start: Callable[[], None] | None = None) -> None:
    """Serve in the foreground until interrupted (what ``verlog serve-model`` does): Ctrl-C and
    SIGTERM stop it the same way, the server stopped and the caller's clean-up run (the trace
    recorder writes what it holds)."""

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            await serve_forever(server, on_start)
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
