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

The server's jobs live in modules of their own: request limits (:mod:`verlog.serve.limits`),
error JSON, header bounds, keys and body reading (:mod:`verlog.serve.http_guards`), admission
(:mod:`verlog.serve.admission`), a request made into an engine call and back
(:mod:`verlog.serve.completion`), recording and feedback (:mod:`verlog.serve.trace_capture`),
model versions and their swaps (:mod:`verlog.serve.policy_swap`); this module routes the
endpoints through them and runs the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading
import time
from typing import Any, Callable, Iterator

from aiohttp import web, web_protocol
from langchain_core.messages import HumanMessage

from verlog.backends.base import Engine, EngineError, Generation, ImageInputs, SamplingParams
from verlog.llm.chat_model import VerlogChatModel
from verlog.local_server import LocalServer
from verlog.serve import openai_protocol as proto
from verlog.serve.admission import Admission
from verlog.serve.completion import CallPlanner, EventStream, PreparedCall, TokenStream, streamable
from verlog.serve.http_guards import (
    check_api_key,
    check_key,
    error_middleware,
    header_bounds_handler,
    header_bounds_middleware,
    parser_bounds,
    read_body,
)
from verlog.serve.limits import ServerLimits
from verlog.serve.openai_protocol import APIError
from verlog.serve.policy_swap import PolicyVersions, Reloaded, ServedPolicy, UnservableModelError, canary
from verlog.serve.trace_capture import attach_feedback, episode_of, record_turn, trace_headers
from verlog.traces.recorder import TraceRecorder

__all__ = [
    "OpenAIServer",
    "Reloaded",
    "ServerLimits",
    "UnservableModelError",
    "run_server",
    "serve_forever",
    "serve_in_thread",
]

log = logging.getLogger(__name__)


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
        processor: a vision-language model's processor (``verlog.models.load_processor``): user
            messages may then hold ``image_url`` parts (base64 data URLs).
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
        processor: Any = None,
    ):
        super().__init__(host, port)
        self.recorder = recorder
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
            processor=processor,
        )
        self.versions = PolicyVersions(
            engine, model_version or model_name, tokenizer, reloader=reloader, on_swap=self._serve_engine
        )
        context = getattr(engine, "max_context", None)
        self.calls = CallPlanner(
            self.chat_model,
            model_name=model_name,
            limits=self.limits,
            max_context=context if isinstance(context, int) and context < 1 << 30 else None,
            keep_messages=lambda: self.recorder is not None and self.recorder.store.policy.privacy == "full",
        )
        #: places, lanes (where bodies are prepared, off the event loop) and generation slots
        self._admission = Admission(
            self.limits.max_concurrency,
            self.limits.max_queue,
            large_body_bytes=self.limits.large_body_bytes,
            large_waiting=self.limits.max_large_queue,
        )
        self._token_bytes = proto.TokenBytes(tokenizer)
        self._running = False
        self.created = proto.now()
        #: counters: requests answered, by HTTP status
        self.responses: dict[int, int] = {}

    # ------------------------------------------------------------------ lifecycle
    @property
    def engine(self) -> Engine:
        """The engine of the model version now in service (new requests go to it)."""
        return self.versions.current.engine

    @property
    def model_version(self) -> str:
        """The id of the weights now in service."""
        return self.versions.current.version

    @property
    def reloader(self) -> Callable[[], Reloaded] | None:
        """What ``POST /v1/admin/reload`` loads the newest checkpoint with (``None``: not served)."""
        return self.versions.reloader

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

    def connection_handler(self) -> type[web_protocol.RequestHandler]:
        """Requests the HTTP parser refuses for their headers are answered 431, as the server's own
        header limits are."""
        return header_bounds_handler(self.limits)

    def app(self) -> web.Application:
        """The aiohttp application (routes and error handling)."""
        timeout = self.limits.read_timeout_s
        app = web.Application(
            client_max_size=self.limits.max_body_bytes,
            middlewares=[error_middleware(self.limits, self.responses), header_bounds_middleware(self.limits)],
            # aiohttp closes a connection whose handler is still waiting for a request's headers
            # when its keep-alive time is up, counted from the connection's start or its last
            # answer: the headers' read timeout. A body left unread after an early answer is
            # drained for at most as long.
            handler_args={
                "keepalive_timeout": timeout,
                "lingering_time": timeout,
                # the parser's own bounds: past them it refuses a request itself (431 too:
                # header_bounds_handler); below them the server's limits answer 431
                # (header_bounds_middleware)
                **parser_bounds(self.limits),
            },
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/feedback", self._feedback)
        app.router.add_post("/v1/admin/reload", self._reload)
        return app

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
        check_api_key(request, self.api_key)
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        check_api_key(request, self.api_key)
        name = request.match_info["model"]
        if name != self.model_name:
            raise self.calls.unknown_model(name)
        return web.json_response(self._model_card())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``: admitted (429 before anything is read when full),
        prepared off the event loop, generated on the version in service, recorded, answered
        whole or as server-sent events."""
        check_api_key(request, self.api_key)
        self._admission.check(self._admission.lane(request.content_length))  # 429 now: nothing read or parsed yet
        raw = await read_body(request, self.limits)
        lane = self._admission.lane(len(raw))
        async with self._admission.admit(lane):
            if lane.pool is None or not self._running:
                raise APIError(503, "the server is stopping", type="server_error")
            async with lane.turn():
                call = await asyncio.get_running_loop().run_in_executor(lane.pool, self.calls.prepare, raw)
            await self._check_constraint(call)
            episode = episode_of(request, call.request, recording=self.recorder is not None)
            async with self._admission.slot():
                policy, started = self.versions.current, time.perf_counter()
                policy.enter()
                try:
                    if call.request.stream:
                        return await self._stream(request, call, policy=policy, episode=episode)
                    generation = await self._generate(call.prompt_ids, call.sampling, policy.engine, call.images)
                finally:
                    policy.leave()
        text = self.calls.answer_text(generation, call.sampling, call.prefix)
        await self._record(call, generation, policy, episode, time.perf_counter() - started, text)
        return web.json_response(
            self._completion(call, generation, text), headers=trace_headers(episode, policy.version)
        )

    async def _check_constraint(self, call: PreparedCall) -> None:
        """400 for a schema or pattern the engine cannot compile (the request's fault)."""
        if call.sampling.constraint is None:
            return
        try:
            await asyncio.to_thread(self.engine.validate_constraint, call.sampling.constraint)
        except EngineError as exc:
            req = call.request
            param = "response_format" if req.response_format else "regex" if req.regex is not None else "tools"
            raise APIError(400, str(exc), param=param) from None

    def _completion(self, call: PreparedCall, generation: Generation, text: str) -> dict[str, Any]:
        """The ``chat.completion`` answer: the message (content and tool calls), logprobs if asked, usage."""
        message = self.chat_model.to_message(
            call.prompt_ids, generation, call.sampling, has_tools=call.has_tools, prefix=call.prefix, images=call.images
        )
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
        if call.request.logprobs:
            choice["logprobs"] = {
                "content": proto.token_logprobs(self._token_bytes, generation.token_ids, generation.logprobs)
            }
        return {
            "id": proto.completion_id(),
            "object": "chat.completion",
            "created": proto.now(),
            "model": self.model_name,
            "choices": [choice],
            "usage": proto.usage(len(call.prompt_ids), len(generation.token_ids)),
        }

    async def _record(
        self,
        call: PreparedCall,
        generation: Generation,
        policy: ServedPolicy,
        episode: str | None,
        latency_s: float,
        text: str,
    ) -> None:
        """The turn into the trace store (:func:`record_turn`), before the answer is sent."""
        await record_turn(
            self.recorder,
            episode,
            call.prompt_ids,
            generation,
            call.sampling,
            policy.version,
            latency_s,
            text,
            call.messages,
        )

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, engine: Engine, images: ImageInputs | None = None
    ) -> Generation:
        with_images = {} if images is None else {"images": images}
        try:
            generation = await asyncio.wait_for(
                engine.generate(prompt_ids, sampling, **with_images), self.limits.request_timeout_s
            )
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
        """A canary before ``engine`` serves (:func:`~verlog.serve.policy_swap.canary` on a short
        prompt rendered with the served template): raises :class:`UnservableModelError` naming
        ``version`` and what went wrong."""
        prompt = self.chat_model.plan_call([HumanMessage("Say hello.")]).prompt_ids
        await canary(engine, prompt, version, self.limits.request_timeout_s)

    # ------------------------------------------------------------------ feedback, swaps
    async def _feedback(self, request: web.Request) -> web.Response:
        """``POST /v1/feedback``: a reward for an episode or a turn (:func:`attach_feedback`)."""
        check_key(request, self._feedback_keys(), "POST /v1/feedback", "API key or admin key")
        if self.recorder is None:  # before the body is read
            raise APIError(404, "this server does not record traces (start it with --record)", code="not_recording")
        return web.json_response(await attach_feedback(self.recorder, await read_body(request, self.limits)))

    async def _reload(self, request: web.Request) -> web.Response:
        """``POST /v1/admin/reload``: put the newest checkpoint of what is served in service."""
        check_key(request, self._reload_keys(), "POST /v1/admin/reload", "admin key" if self.admin_key else "API key")
        return web.json_response(await self.versions.reload(self.check_engine))

    def _feedback_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.api_key, self.admin_key) if k)

    def _reload_keys(self) -> tuple[str, ...]:
        return (self.admin_key,) if self.admin_key else ((self.api_key,) if self.api_key else ())

    async def swap(self, engine: Engine, version: str, *, tokenizer: Any = None, close_old: bool = True) -> str:
        """Serve ``engine`` (model version ``version``) from now on; returns the version it replaces
        (:meth:`PolicyVersions.swap`: requests in flight finish on the old one, then it is closed)."""
        return await self.versions.swap(engine, version, tokenizer=tokenizer, close_old=close_old)

    def _serve_engine(self, engine: Engine) -> None:
        self.chat_model.engine = engine

    # ------------------------------------------------------------------ streaming
    async def _stream(
        self, request: web.Request, call: PreparedCall, *, policy: ServedPolicy, episode: str | None
    ) -> web.StreamResponse:
        """The answer as server-sent events: content as soon as it is sure to be in the final
        content (:func:`streamable`, with its logprobs if asked), then the tool calls, the finish
        reason and the usage (:meth:`_stream_end`). A failure mid-stream ends it with an error event."""
        started = time.perf_counter()
        stream = TokenStream(policy.engine, call.prompt_ids, call.sampling, call.images)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **trace_headers(episode, policy.version),
            }
        )
        events = EventStream(response, self._token_bytes, self.model_name, logprobs=bool(call.request.logprobs))

        async def pump() -> None:
            async for batch in stream:
                events.add(batch)
                text = call.prefix + self.chat_model.answer_text(events.ids, call.sampling, finished=False)
                ready = streamable(text, call.sampling, call.has_tools)
                if len(ready) > len(events.sent) and ready.startswith(events.sent):
                    delta, events.sent = ready[len(events.sent) :], ready
                    await events.chunk({"content": delta}, with_logprobs=True)

        try:
            await response.prepare(request)
            await events.chunk({"role": "assistant", "content": ""})
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
            await events.emit(proto.error_body(message, type="server_error"))
            await events.done()
            return response
        self.failure = None
        await self._stream_end(call, stream.generation, events, policy, episode, time.perf_counter() - started)
        return response

    async def _stream_end(
        self,
        call: PreparedCall,
        generation: Generation,
        events: EventStream,
        policy: ServedPolicy,
        episode: str | None,
        latency_s: float,
    ) -> None:
        """A finished stream's last events: the turn is committed first (a client that saw
        ``[DONE]`` was recorded), then the content not yet sent, the tool calls, the finish
        reason, the usage if asked, ``[DONE]``."""
        text = self.calls.answer_text(generation, call.sampling, call.prefix)
        await self._record(call, generation, policy, episode, latency_s, text)
        message = self.chat_model.to_message(
            call.prompt_ids, generation, call.sampling, has_tools=call.has_tools, prefix=call.prefix, images=call.images
        )
        content, calls = proto.answer_parts(message, text)
        rest = content[len(events.sent) :] if content.startswith(events.sent) else ""
        if rest or events.unreported():
            await events.chunk({"content": rest}, with_logprobs=True)
        for index, tool_call in enumerate(calls):
            await events.chunk({"tool_calls": [{"index": index, **tool_call}]})
        await events.chunk({}, finish=proto.finish_reason(bool(calls), generation.finish_reason))
        options = call.request.stream_options
        if options is not None and options.include_usage:
            await events.emit(events.usage(len(call.prompt_ids), len(generation.token_ids)))
        await events.done()


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
