"""A client of a running SGLang server: token ids in, token ids and logprobs out, over HTTP.

verlog talks to SGLang through its native ``POST /generate`` endpoint, never the OpenAI API:
that endpoint takes ``input_ids`` and returns the generated ids (``output_ids``) and one logprob
per generated token (``meta_info.output_token_logprobs``), so nothing is re-tokenized. SGLang
itself need not be importable here (it is CUDA-only); any server that speaks the protocol works,
including :class:`verlog.backends.sglang_server.SGLangCompatServer` in front of another engine.

Protocol notes (SGLang 0.4 - 0.5):

* ``output_ids`` are the raw generated ids, the stop token included (SGLang trims only the
  ``text``). Some older servers return them only when launched with ``--return-token-ids``;
  the ids inside ``output_token_logprobs`` (``[logprob, token_id, text_or_null]``) are then used.
* A ``rid`` must be unique among the requests a server is running ("Duplicate request ID
  detected" is a 400), and a request whose client timed out may still be running when the retry
  arrives. So each call sends ``rid = f"{request_id}_t{n}"`` and each retry appends ``_r{k}``:
  the SGLang router (sgl-model-gateway) strips exactly these suffixes to route every turn of an
  episode to the same worker (with ``--routing-key-override``); the plain ``request_id`` also
  goes out as the ``x-smg-routing-key`` header.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import secrets
import threading
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Mapping

import aiohttp

from verlog.backends.base import (
    Engine,
    EngineError,
    EngineTimeoutError,
    FinishReason,
    Generation,
    SamplingParams,
)

#: header the SGLang router reads a routing key from (besides the body ``rid``)
ROUTING_KEY_HEADER = "x-smg-routing-key"

_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "abort"})
_MAX_BACKOFF_S = 30.0
_BODY_SNIPPET = 500


class _RetryableError(Exception):
    """One attempt failed in a way a later attempt may not (timeout, connection, 5xx, 429)."""

    def __init__(
        self, message: str, *, timed_out: bool = False, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.retry_after_s = retry_after_s


@dataclass
class _LoopSession:
    """The HTTP session of one event loop, and the async generator that closes it."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    keeper: AsyncGenerator[None, None]


class SGLangEngine(Engine):
    """An :class:`Engine` backed by a running SGLang server (or anything speaking its protocol).

    Safe to call concurrently and from several event loops: each loop gets its own
    ``aiohttp.ClientSession`` (sessions are bound to the loop that made them). A session is closed
    when its loop shuts down through ``asyncio.run`` (or any runner that finalizes async
    generators), and all of them by :meth:`aclose`.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:30000"``.
        timeout_s: the most one HTTP attempt may take, from sending to the full response.
        max_retries: further attempts after a timeout, a connection error, a 5xx or a 429; other
            4xx answers are not retried.
        retry_backoff_s: wait before the first retry, doubled for each further one (capped at
            30 s; a ``Retry-After`` header can lengthen it).
        eos_token_ids: the model's end-of-sequence ids, sent as ``stop_token_ids`` with every
            request (SGLang also stops on the model's own EOS unless told not to).
        api_key: sent as ``Authorization: Bearer ...`` (SGLang's ``--api-key``).
        headers: extra headers for every request.
        max_connections: the most connections open at once per event loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        eos_token_ids: tuple[int, ...] | list[int] = (),
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 1024,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {retry_backoff_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.max_connections = max_connections
        self._headers: dict[str, str] = dict(headers or {})
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._sessions: dict[asyncio.AbstractEventLoop, _LoopSession] = {}
        self._lock = threading.Lock()
        # starts at a random value so two processes sharing a request id still send distinct rids
        self._call_seq = itertools.count(secrets.randbelow(10**9))

    def __repr__(self) -> str:
        return f"SGLangEngine({self.base_url!r})"

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Generation:
        """Send one ``/generate`` request (retrying transient failures) and parse the answer."""
        payload = self.build_payload(prompt_ids, sampling)
        headers = {ROUTING_KEY_HEADER: request_id} if _is_header_safe(request_id) else {}
        rid = f"{request_id}_t{next(self._call_seq)}" if request_id else None
        body = await self._post_with_retries("/generate", payload, rid=rid, headers=headers)
        return parse_generate_response(body, url=self.base_url + "/generate")

    def build_payload(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The ``/generate`` body for one prompt (without ``rid``, which is set per attempt)."""
        params: dict[str, Any] = {
            # SGLang turns temperature 0 into greedy decoding (top_k = 1) itself
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # -1 = the whole vocabulary, as in SGLang
            "max_new_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        stop_ids = self.stop_token_ids(sampling)
        if stop_ids:
            params["stop_token_ids"] = stop_ids
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {
            "input_ids": [int(t) for t in prompt_ids],
            "sampling_params": params,
            "return_logprob": True,
            # -1: logprobs of the generated tokens only, none for the prompt
            "logprob_start_len": -1,
            "stream": False,
        }

    async def _post_with_retries(
        self,
        path: str,
        payload: dict[str, Any],
        *,
        rid: str | None,
        headers: Mapping[str, str],
    ) -> Any:
        url = self.base_url + path
        attempts = self.max_retries + 1
        last: _RetryableError | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self._backoff_s(attempt, last))
            body = payload
            if rid is not None:
                body = {**payload, "rid": rid if attempt == 0 else f"{rid}_r{attempt}"}
            try:
                return await self._post_once(url, body, headers)
            except _RetryableError as exc:
                last = exc
        assert last is not None
        if last.timed_out:
            raise EngineTimeoutError(
                f"SGLang server at {url} did not answer within {self.timeout_s:g}s "
                f"({attempts} attempt{'s' if attempts > 1 else ''})"
            )
        raise EngineError(
            f"SGLang request to {url} failed after {attempts} attempt"
            f"{'s' if attempts > 1 else ''}: {last}"
        )

    def _backoff_s(self, attempt: int, last: _RetryableError | None) -> float:
        wait = min(self.retry_backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S)
        if last is not None and last.retry_after_s is not None:
            wait = max(wait, min(last.retry_after_s, _MAX_BACKOFF_S))
        return wait

    async def _post_once(self, url: str, body: dict[str, Any], headers: Mapping[str, str]) -> Any:
        session = await self._session()
        try:
            async with session.post(
                url,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = _parse_retry_after(resp.headers.get("Retry-After"))
        except asyncio.TimeoutError:
            raise _RetryableError(f"timed out after {self.timeout_s:g}s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise _RetryableError(f"{type(exc).__name__}: {exc}") from exc
        if status >= 500 or status == 429:
            raise _RetryableError(f"HTTP {status}: {_error_text(raw)}", retry_after_s=retry_after)
        if status >= 400:
            raise EngineError(f"SGLang server at {url} rejected the request (HTTP {status}): "
                              f"{_error_text(raw)}")
        try:
            return json.loads(raw)
        except ValueError:
            raise EngineError(
                f"SGLang server at {url} answered HTTP {status} with a body that is not JSON: "
                f"{_snippet(raw)!r}"
            ) from None

    # ------------------------------------------------------------------ health

    async def health(self, *, generate: bool = False, timeout_s: float = 5.0) -> bool:
        """Whether the server answers ``GET /health`` (``/health_generate`` with ``generate``).

        ``/health`` answers 503 while SGLang is still loading; ``/health_generate`` runs a
        one-token generation, so it also proves the scheduler and GPU are working.
        """
        path = "/health_generate" if generate else "/health"
        session = await self._session()
        try:
            async with session.get(
                self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (asyncio.TimeoutError, aiohttp.ClientError):
            return False

    async def wait_until_ready(
        self, timeout: float = 300.0, *, poll_interval_s: float = 0.5, generate: bool = False
    ) -> None:
        """Poll :meth:`health` until it is true; :class:`EngineTimeoutError` after ``timeout`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if await self.health(generate=generate, timeout_s=max(0.1, min(5.0, remaining))):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineTimeoutError(
                    f"SGLang server at {self.base_url} was not ready after {timeout:g}s "
                    f"(GET {'/health_generate' if generate else '/health'} never answered 200); "
                    "is it running, and has it finished loading the model?"
                )
            await asyncio.sleep(min(poll_interval_s, remaining))

    # ------------------------------------------------------------------ sessions

    @property
    def open_sessions(self) -> int:
        """How many event loops hold an open HTTP session of this engine."""
        with self._lock:
            return len(self._sessions)

    async def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._sessions.get(loop)
            stale = [e for e in self._sessions.values() if e.loop.is_closed()]
        if entry is not None and not entry.session.closed:
            return entry.session
        for old in stale:
            await self._forget_closed_loop(old)
        with self._lock:
            entry = self._sessions.get(loop)
            if entry is not None and not entry.session.closed:
                return entry.session
            session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
            keeper = self._keep(loop, session)
            entry = _LoopSession(loop, session, keeper)
            self._sessions[loop] = entry
        # Starting the generator registers it with the loop, which closes it (and so the session)
        # on shutdown: ``asyncio.run`` and ``asyncio.Runner`` call ``loop.shutdown_asyncgens()``.
        await keeper.__anext__()
        return session

    async def _keep(
        self, loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            try:
                await session.close()
            finally:
                with self._lock:
                    entry = self._sessions.get(loop)
                    if entry is not None and entry.session is session:
                        del self._sessions[loop]

    @staticmethod
    async def _forget_closed_loop(entry: _LoopSession) -> None:
        """Drop the session of a loop closed without finalizing async generators.

        Its connections cannot be shut down cleanly any more (that needs their loop); closing the
        session from here only marks it closed, touching no loop, so nothing warns about it.
        """
        try:
            await entry.keeper.aclose()
        except RuntimeError:  # another thread is closing it right now
            pass

    async def aclose(self) -> None:
        """Close the HTTP sessions of every event loop.

        Sessions of loops running in other threads are closed on those loops; the session of an
        open loop that is not running now is closed when that loop shuts down.
        """
        current = asyncio.get_running_loop()
        with self._lock:
            entries = list(self._sessions.values())
        for entry in entries:
            if entry.loop is current:
                await entry.keeper.aclose()
            elif entry.loop.is_closed():
                await self._forget_closed_loop(entry)
            elif entry.loop.is_running():
                # a loop in another thread: close its session there
                fut = asyncio.run_coroutine_threadsafe(entry.keeper.aclose(), entry.loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(fut), timeout=5.0)
                except (asyncio.TimeoutError, RuntimeError):
                    pass
            # an open loop that is not running closes its session when it shuts down

    async def __aenter__(self) -> SGLangEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# ---------------------------------------------------------------------- response parsing


def parse_generate_response(body: Any, *, url: str = "the SGLang server") -> Generation:
    """Turn one non-streaming ``/generate`` answer into a :class:`Generation`.

    Checks what training relies on and raises :class:`EngineError` naming the problem otherwise:
    one finite logprob per generated token, and the same ids in ``output_ids`` and in
    ``output_token_logprobs``. ``Generation.info`` is the server's ``meta_info``, as sent.
    """

    def bad(problem: str) -> EngineError:
        return EngineError(f"malformed /generate response from {url}: {problem}")

    if not isinstance(body, dict):
        raise bad(f"expected a JSON object, got {type(body).__name__}")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise bad("no 'meta_info' object")
    finish_reason = _parse_finish_reason(meta.get("finish_reason"), bad)

    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise bad("no 'meta_info.output_token_logprobs' (was return_logprob dropped?)")
    if not isinstance(entries, list):
        raise bad("'meta_info.output_token_logprobs' is not a list")
    logprobs: list[float] = []
    lp_ids: list[int] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise bad(f"output_token_logprobs[{i}] is {entry!r}, not [logprob, token_id, ...]")
        logprob, token_id = entry[0], entry[1]
        if not _is_number(logprob) or not math.isfinite(logprob) or logprob > 1e-4:
            raise bad(f"output_token_logprobs[{i}] has logprob {logprob!r} (null means NaN)")
        if not _is_int(token_id):
            raise bad(f"output_token_logprobs[{i}] has token id {token_id!r}")
        logprobs.append(float(logprob))
        lp_ids.append(int(token_id))

    output_ids = body.get("output_ids")
    if output_ids is None:
        token_ids = lp_ids
    else:
        if not isinstance(output_ids, list) or not all(_is_int(t) for t in output_ids):
            raise bad("'output_ids' is not a list of token ids")
        token_ids = [int(t) for t in output_ids]
        if token_ids != lp_ids:
            raise bad(
                f"'output_ids' ({len(token_ids)} ids) disagree with the ids in "
                f"output_token_logprobs ({len(lp_ids)} ids), first difference at index "
                f"{_first_difference(token_ids, lp_ids)}"
            )
    return Generation(token_ids, logprobs, finish_reason, info=meta)


def _parse_finish_reason(raw: Any, bad: Any) -> FinishReason:
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind not in _FINISH_REASONS:
        raise bad(f"unknown finish_reason {raw!r}")
    return kind  # type: ignore[return-value]


def _is_header_safe(value: str | None) -> bool:
    """Whether ``value`` can go out as a routing-key header (the router takes <= 128 bytes)."""
    return value is not None and 0 < len(value) <= 128 and value.isascii() and value.isprintable()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ignored


def _snippet(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= _BODY_SNIPPET else text[:_BODY_SNIPPET] + "..."


def _error_text(raw: bytes) -> str:
    """The message of an SGLang error body (``{"error": {"message"}}`` or ``{"detail"}``)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _snippet(raw) or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("detail"), str):
            return body["detail"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return _snippet(raw)
