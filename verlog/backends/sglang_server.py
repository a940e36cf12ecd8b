"""An HTTP server that speaks SGLang's native ``/generate`` protocol on top of any verlog engine.

Two uses: tests run :class:`~verlog.backends.sglang.SGLangEngine` against a real HTTP server over
loopback (with faults injected on purpose), and users can put an in-process engine (e.g. the
embedded transformers engine) behind the SGLang protocol, so tools written for SGLang talk to it::

    async with SGLangCompatServer(engine, port=30000) as server:
        client = SGLangEngine(server.url)

Only what verlog needs is served: ``POST /generate`` for one prompt given as ``input_ids``
(no ``text``: there is no tokenizer here), output logprobs only, whole or streamed (``"stream":
true``: server-sent events, each chunk holding the ids and logprobs generated so far, as SGLang
sends them by default, then ``data: [DONE]``); ``GET /health`` and ``GET /health_generate``. Requests it cannot honour exactly are refused with HTTP 400 and
SGLang's error body ``{"error": {"message": ...}}`` rather than served approximately.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web

from verlog.backends.base import Engine, EngineError, Generation, SamplingParams, TokenDelta
from verlog.local_server import LocalServer

#: SGLang's ``top_k`` meaning "the whole vocabulary" (besides -1)
_TOP_K_ALL = 1 << 30

#: sampling params accepted only at their neutral value (anything else cannot be honoured)
_NEUTRAL_PARAMS: dict[str, Any] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "ignore_eos": False,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "custom_params": None,
    "stop_regex": None,
}
#: sampling params that only shape the decoded ``text``, which ids-only clients ignore
_TEXT_ONLY_PARAMS = frozenset(
    {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"}
)
_SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "sampling_seed"}
)
#: top-level request fields this server reads, or ignores because they do not change the
#: ids or logprobs; any other field is accepted only when null or false (i.e. switched off)
_KNOWN_FIELDS = frozenset(
    {
        "rid",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "stream",
        "return_text_in_logprobs",
        "log_metrics",
        "session_id",
        "routing_key",
        "priority",
        "custom_labels",
        "no_logs",
    }
)


class BadRequest(ValueError):
    """A ``/generate`` body this server refuses (answered with HTTP 400)."""


@dataclass(frozen=True)
class GenerateCall:
    """One ``/generate`` request as the server received it (what fault hooks and tests see)."""

    #: 0 for the first ``/generate`` request this server received, then 1, 2, ...
    index: int
    #: the parsed JSON body (``None`` if it was not JSON)
    body: Any
    headers: Mapping[str, str]


#: A fault hook runs before each ``/generate`` request is served. It may sleep (a slow server),
#: return a response to send instead (an error, a malformed body), or return ``None`` to serve
#: the request normally.
FaultHook = Callable[[GenerateCall], Awaitable["web.StreamResponse | None"]]


def fail_first(n: int, *, status: int = 500, message: str = "injected failure") -> FaultHook:
    """A fault: answer the first ``n`` ``/generate`` requests with HTTP ``status``."""

    async def hook(call: GenerateCall) -> web.StreamResponse | None:
        return error_response(status, message) if call.index < n else None

    return hook


def delay(seconds: float, *, first: int | None = None) -> FaultHook:
    """A fault: wait ``seconds`` before serving (only the first ``first`` requests, if given)."""

    async def hook(call: GenerateCall) -> web.StreamResponse | None:
        if first is None or call.index < first:
            await asyncio.sleep(seconds)
        return None

    return hook


def respond_with(body: Any, *, status: int = 200, first: int | None = None) -> FaultHook:
    """A fault: answer with ``body`` (JSON-encoded unless ``str`` / ``bytes``), not the engine."""
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)

    async def hook(call: GenerateCall) -> web.StreamResponse | None:
        if first is not None and call.index >= first:
            return None
        return web.Response(body=raw, status=status, content_type="application/json")

    return hook


def error_response(status: int, message: str) -> web.Response:
    """An error in SGLang's format: ``{"error": {"message": ...}}``."""
    return web.json_response({"error": {"message": message}}, status=status)


@dataclass
class ServerStats:
    """What the server saw, for tests and debugging."""

    #: ``/generate`` requests received, and answered by the engine
    received: int = 0
    served: int = 0
    #: the most recent requests (see ``history`` of :class:`SGLangCompatServer`)
    recent: deque[GenerateCall] = field(default_factory=deque)


class SGLangCompatServer(LocalServer):
    """Serves SGLang's ``/generate`` and ``/health`` protocol on top of a verlog :class:`Engine`.

    Args:
        engine: answers the requests; its ``generate`` sees the prompt ids, the sampling params
            and the request's ``rid`` as ``request_id``.
        host, port: where to listen; ``port=0`` picks a free port (see :attr:`url`).
        fault: a :data:`FaultHook` run before serving each ``/generate`` request (tests).
        detokenize: turns output ids into the response's ``text``; without it ``text`` is left
            out, as SGLang does when launched with ``--skip-tokenizer-init``.
        history: how many of the latest requests :attr:`calls` keeps.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        fault: FaultHook | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        history: int = 1000,
    ) -> None:
        super().__init__(host, port)
        self.engine = engine
        self.fault = fault
        self.detokenize = detokenize
        #: ``GET /health`` answers 503 while this is false (SGLang does so while loading)
        self.ready = True
        self.stats = ServerStats(recent=deque(maxlen=history))
        self._running_rids: set[str] = set()

    @property
    def calls(self) -> list[GenerateCall]:
        """The latest ``/generate`` requests received (all of them, up to ``history``), in order."""
        return list(self.stats.recent)

    def app(self) -> web.Application:
        """SGLang's routes: ``POST /generate``, ``GET /health``, ``GET /health_generate``."""
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health_generate)
        return app

    # ------------------------------------------------------------------ handlers

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _health_generate(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        try:
            await self.engine.generate([0], SamplingParams(temperature=0.0, max_new_tokens=1))
        except EngineError:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        call = GenerateCall(self.stats.received, body, request.headers.copy())
        self.stats.received += 1
        self.stats.recent.append(call)
        if self.fault is not None:
            injected = await self.fault(call)
            if injected is not None:
                return injected
        if body is None:
            return error_response(400, "the request body is not valid JSON")
        try:
            prompt_ids, sampling, rid, want_logprobs = parse_generate_request(body)
        except BadRequest as exc:
            return error_response(400, str(exc))
        if rid in self._running_rids:
            return error_response(400, f"Duplicate request ID detected: {rid}")
        if body.get("stream"):
            return await self._stream(request, prompt_ids, sampling, rid, want_logprobs)
        self._running_rids.add(rid)
        started = time.perf_counter()
        try:
            generation = await self.engine.generate(prompt_ids, sampling, request_id=rid)
        except EngineError as exc:
            return error_response(500, f"engine error: {exc}")
        finally:
            self._running_rids.discard(rid)
        self.stats.served += 1
        return web.json_response(
            self.render_response(rid, prompt_ids, sampling, generation, want_logprobs, time.perf_counter() - started)
        )

    async def _stream(
        self, request: web.Request, prompt_ids: list[int], sampling: SamplingParams, rid: str, want_logprobs: bool
    ) -> web.StreamResponse:
        """Serve one streamed ``/generate``: a chunk per batch of new tokens, the last one with
        the finish reason (SGLang's cumulative chunks), then ``data: [DONE]``."""
        self._running_rids.add(rid)
        started = time.perf_counter()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        ids: list[int] = []
        logprobs: list[float] = []

        async def emit(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        try:
            await response.prepare(request)
            async for item in self.engine.stream(prompt_ids, sampling, request_id=rid):
                latency = time.perf_counter() - started
                if isinstance(item, TokenDelta):
                    ids += item.token_ids
                    logprobs += item.logprobs
                    partial = Generation(list(ids), list(logprobs), "length")
                    chunk = self.render_response(rid, prompt_ids, sampling, partial, want_logprobs, latency)
                    chunk["meta_info"]["finish_reason"] = None
                else:
                    chunk = self.render_response(rid, prompt_ids, sampling, item, want_logprobs, latency)
                    self.stats.served += 1
                await emit(chunk)
        except EngineError as exc:
            await emit({"error": {"message": f"engine error: {exc}"}})
        finally:
            self._running_rids.discard(rid)
        await emit("[DONE]")
        await response.write_eof()
        return response

    def render_response(
        self,
        rid: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        generation: Generation,
        want_logprobs: bool,
        latency_s: float,
    ) -> dict[str, Any]:
        """The ``/generate`` answer for one generation, shaped as SGLang's."""
        ids = list(generation.token_ids)
        if generation.finish_reason == "length":
            finish: dict[str, Any] = {"type": "length", "length": len(ids)}
        elif generation.finish_reason == "abort":
            finish = {"type": "abort", "message": str(generation.info.get("message", "aborted"))}
        else:
            stop_ids = self.engine.stop_token_ids(sampling)
            matched = ids[-1] if ids and ids[-1] in stop_ids else None
            finish = {"type": "stop", "matched": matched}
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": latency_s,
        }
        if want_logprobs:
            meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(generation.logprobs, ids)]
        out: dict[str, Any] = {"output_ids": ids, "meta_info": meta}
        if self.detokenize is not None:
            out["text"] = self.detokenize(ids)
        return out


def parse_generate_request(body: Any) -> tuple[list[int], SamplingParams, str, bool]:
    """Validate a ``/generate`` body: ``(prompt_ids, sampling, rid, return_logprob)``.

    Raises :class:`BadRequest` (HTTP 400) for anything this server cannot serve exactly.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("text") is not None:
        raise BadRequest("send 'input_ids', not 'text': this server has no tokenizer")
    ids = body.get("input_ids")
    if ids is None:
        raise BadRequest("missing 'input_ids'")
    if not isinstance(ids, list) or not ids:
        raise BadRequest("'input_ids' must be a non-empty list of token ids")
    if any(isinstance(t, list) for t in ids):
        raise BadRequest("batched 'input_ids' are not supported: send one prompt per request")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise BadRequest("'input_ids' must be a list of non-negative integers")
    unknown = sorted(k for k, v in body.items() if k not in _KNOWN_FIELDS and v is not None and v is not False)
    if unknown:
        raise BadRequest(f"unsupported request fields: {', '.join(unknown)}")
    if body.get("stream") not in (None, True, False):
        raise BadRequest("'stream' must be true or false")
    want_logprobs = bool(body.get("return_logprob", False))
    if want_logprobs and body.get("logprob_start_len", -1) not in (-1, None):
        raise BadRequest("prompt logprobs are not supported: use logprob_start_len -1")
    if body.get("top_logprobs_num") not in (None, 0):
        raise BadRequest("top logprobs are not supported")
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif not isinstance(rid, str) or not rid:
        raise BadRequest("'rid' must be a non-empty string")
    return list(ids), _parse_sampling(body.get("sampling_params")), rid, want_logprobs


def _parse_sampling(raw: Any) -> SamplingParams:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("'sampling_params' must be a JSON object")
    unsupported = sorted(
        key
        for key, value in raw.items()
        if key not in _SAMPLING_KEYS
        and key not in _TEXT_ONLY_PARAMS
        and not (key in _NEUTRAL_PARAMS and value == _NEUTRAL_PARAMS[key])
    )
    if unsupported:
        raise BadRequest(f"unsupported sampling params: {', '.join(unsupported)}")

    def get(key: str, default: Any) -> Any:
        value = raw.get(key)
        return default if value is None else value  # SGLang treats null as "default"

    stop = get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("'stop' must be a string or a list of strings")
    stop_ids = get("stop_token_ids", [])
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of token ids")
    top_k = get("top_k", -1)
    seed = raw.get("sampling_seed")
    numbers = {
        "temperature": get("temperature", 1.0),
        "top_p": get("top_p", 1.0),
        "top_k": top_k,
        "max_new_tokens": get("max_new_tokens", 128),
    }
    for key, value in numbers.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise BadRequest(f"'{key}' must be a number, got {value!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest(f"'sampling_seed' must be an integer, got {seed!r}")
    if not float(top_k).is_integer() or not float(numbers["max_new_tokens"]).is_integer():
        raise BadRequest("'top_k' and 'max_new_tokens' must be integers")
    try:
        return SamplingParams(
            temperature=float(numbers["temperature"]),
            top_p=float(numbers["top_p"]),
            top_k=-1 if top_k >= _TOP_K_ALL else int(top_k),
            max_new_tokens=int(numbers["max_new_tokens"]),
            stop=tuple(stop),
            stop_token_ids=tuple(dict.fromkeys(stop_ids)),
            seed=seed,
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
