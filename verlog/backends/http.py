"""The HTTP plumbing every engine that talks to a server shares: sessions, retries, timeouts.

:class:`HTTPEngine` is the base of :class:`~verlog.backends.sglang.SGLangEngine`; another engine
behind an HTTP API subclasses it and only writes its request and response formats:

* one ``aiohttp.ClientSession`` per event loop (sessions are bound to the loop that made them;
  a sync LangChain call runs on its own loop), closed when that loop shuts down or on
  :meth:`HTTPEngine.aclose`;
* :meth:`HTTPEngine.post_json` and :meth:`HTTPEngine.post_events` (server-sent events) retry
  timeouts, connection errors, 5xx and 429 answers with exponential backoff (a ``Retry-After``
  header can lengthen it), and raise :class:`~verlog.backends.base.EngineError` /
  :class:`~verlog.backends.base.EngineTimeoutError` naming the server, the attempts and the
  server's own error message otherwise.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Mapping

import aiohttp

from verlog.backends.base import Engine, EngineError, EngineTimeoutError

MAX_BACKOFF_S = 30.0
_BODY_SNIPPET = 500

#: the body of attempt ``k`` (0 for the first try), e.g. with a fresh request id per retry
BodyForAttempt = Callable[[int], dict[str, Any]]


class RetryableError(Exception):
    """One attempt failed in a way a later attempt may not (timeout, connection, 5xx, 429)."""

    def __init__(self, message: str, *, timed_out: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.retry_after_s = retry_after_s


@dataclass
class _LoopSession:
    """The HTTP session of one event loop, and the async generator that closes it."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    keeper: AsyncGenerator[None, None]


class HTTPEngine(Engine):
    """An :class:`Engine` whose generations come from an HTTP server (abstract: subclasses write
    :meth:`generate` with :meth:`post_json` / :meth:`post_events`).

    Safe to call concurrently and from several event loops.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:30000"``.
        timeout_s: the most one HTTP attempt may take, from sending to the full response.
        max_retries: further attempts after a timeout, a connection error, a 5xx or a 429; other
            4xx answers are not retried.
        retry_backoff_s: wait before the first retry, doubled for each further one (capped at
            30 s; a ``Retry-After`` header can lengthen it).
        api_key: sent as ``Authorization: Bearer ...``.
        headers: extra headers for every request.
        max_connections: the most connections open at once per event loop.
    """

    #: how errors name the server (e.g. "SGLang server")
    server_name = "HTTP server"
    #: sessions are bound to a loop: sync calls share the bridge loop's instead of one per thread
    sync_on_thread_loop = False

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
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
        self.max_connections = max_connections
        self._headers: dict[str, str] = dict(headers or {})
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._sessions: dict[asyncio.AbstractEventLoop, _LoopSession] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # ------------------------------------------------------------------ requests
    async def post_json(self, path: str, body: BodyForAttempt, *, headers: Mapping[str, str] | None = None) -> Any:
        """POST ``body(attempt)`` as JSON to ``path``, retrying transient failures; the parsed
        JSON answer."""

        async def once(url: str, payload: dict[str, Any]) -> Any:
            async with self._post(url, payload, headers) as resp:
                raw = await resp.read()
            return self._parse_json(url, resp.status, raw)

        return await self._with_retries(path, body, once)

    async def post_events(
        self, path: str, body: BodyForAttempt, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Any]:
        """POST ``body(attempt)`` and yield the JSON of each server-sent event (``data: ...``)
        until ``data: [DONE]`` or the end of the stream.

        Failures before the first event are retried like :meth:`post_json`; once events have
        arrived a failure raises :class:`EngineError` (what was streamed cannot be taken back).
        ``timeout_s`` bounds the whole stream.
        """
        url = self.base_url + path
        attempts = self.max_retries + 1
        last: RetryableError | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self._backoff_s(attempt, last))
            started = False
            try:
                async with self._post(url, body(attempt), headers) as resp:
                    if resp.status >= 400:
                        self._parse_json(url, resp.status, await resp.read())  # raises
                    async for event in _events(resp):
                        started = True
                        yield event
                return
            except RetryableError as exc:
                if started:
                    raise self._final_error(url, 1, exc) from None
                last = exc
            except asyncio.TimeoutError:
                exc = RetryableError(f"timed out after {self.timeout_s:g}s", timed_out=True)
                if started:
                    raise self._final_error(url, 1, exc) from None
                last = exc
            except aiohttp.ClientError as exc:
                err = RetryableError(f"{type(exc).__name__}: {exc}")
                if started:
                    raise self._final_error(url, 1, err) from None
                last = err
        assert last is not None
        raise self._final_error(url, attempts, last)

    async def get_ok(self, path: str, *, timeout_s: float = 5.0) -> bool:
        """Whether ``GET path`` answers 200 within ``timeout_s`` (no retries)."""
        session = await self._session()
        try:
            async with session.get(self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                return resp.status == 200
        except (asyncio.TimeoutError, aiohttp.ClientError):
            return False

    async def wait_until_ok(self, path: str, timeout: float, *, poll_interval_s: float = 0.5, hint: str = "") -> None:
        """Poll ``GET path`` until it answers 200; :class:`EngineTimeoutError` after ``timeout`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if await self.get_ok(path, timeout_s=max(0.1, min(5.0, remaining))):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineTimeoutError(
                    f"{self.server_name} at {self.base_url} was not ready after {timeout:g}s "
                    f"(GET {path} never answered 200){hint}"
                )
            await asyncio.sleep(min(poll_interval_s, remaining))

    # ------------------------------------------------------------------ retries
    async def _with_retries(self, path: str, body: BodyForAttempt, once: Callable[[str, dict[str, Any]], Any]) -> Any:
        url = self.base_url + path
        attempts = self.max_retries + 1
        last: RetryableError | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self._backoff_s(attempt, last))
            try:
                return await once(url, body(attempt))
            except RetryableError as exc:
                last = exc
            except asyncio.TimeoutError:
                last = RetryableError(f"timed out after {self.timeout_s:g}s", timed_out=True)
            except aiohttp.ClientError as exc:
                last = RetryableError(f"{type(exc).__name__}: {exc}")
        assert last is not None
        raise self._final_error(url, attempts, last)

    def _final_error(self, url: str, attempts: int, last: RetryableError) -> EngineError:
        plural = "s" if attempts > 1 else ""
        if last.timed_out:
            return EngineTimeoutError(
                f"{self.server_name} at {url} did not answer within {self.timeout_s:g}s ({attempts} attempt{plural})"
            )
        request = self.server_name.replace(" server", "") + " request"
        return EngineError(f"{request} to {url} failed after {attempts} attempt{plural}: {last}")

    def _backoff_s(self, attempt: int, last: RetryableError | None) -> float:
        wait = min(self.retry_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
        if last is not None and last.retry_after_s is not None:
            wait = max(wait, min(last.retry_after_s, MAX_BACKOFF_S))
        return wait

    def _post(self, url: str, payload: dict[str, Any], headers: Mapping[str, str] | None) -> "_Post":
        return _Post(self, url, payload, headers or {})

    def _parse_json(self, url: str, status: int, raw: bytes, retry_after: float | None = None) -> Any:
        """The JSON of an answer; a retryable error for 5xx / 429, an :class:`EngineError` for
        other 4xx answers and bodies that are not JSON."""
        if status >= 500 or status == 429:
            raise RetryableError(f"HTTP {status}: {error_text(raw)}", retry_after_s=retry_after)
        if status >= 400:
            raise EngineError(f"{self.server_name} at {url} rejected the request (HTTP {status}): {error_text(raw)}")
        try:
            return json.loads(raw)
        except ValueError:
            raise EngineError(
                f"{self.server_name} at {url} answered HTTP {status} with a body that is not JSON: {snippet(raw)!r}"
            ) from None

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
                headers=self._headers, connector=aiohttp.TCPConnector(limit=self.max_connections)
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
                fut = asyncio.run_coroutine_threadsafe(entry.keeper.aclose(), entry.loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(fut), timeout=5.0)
                except (asyncio.TimeoutError, RuntimeError):
                    pass
            # an open loop that is not running closes its session when it shuts down

    async def __aenter__(self) -> "HTTPEngine":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Post:
    """``async with`` one POST attempt: the response, with failures turned into
    :class:`RetryableError` (timeouts, connection errors)."""

    def __init__(self, engine: HTTPEngine, url: str, payload: dict[str, Any], headers: Mapping[str, str]):
        self.engine, self.url, self.payload, self.headers = engine, url, payload, headers
        self._cm: Any = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        session = await self.engine._session()
        self._cm = session.post(
            self.url,
            json=self.payload,
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=self.engine.timeout_s),
        )
        try:
            resp = await self._cm.__aenter__()
        except asyncio.TimeoutError:
            raise RetryableError(f"timed out after {self.engine.timeout_s:g}s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
        if resp.status >= 500 or resp.status == 429:
            raw = await resp.read()
            await self._cm.__aexit__(None, None, None)
            raise RetryableError(
                f"HTTP {resp.status}: {error_text(raw)}",
                retry_after_s=parse_retry_after(resp.headers.get("Retry-After")),
            )
        return resp

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._cm.__aexit__(*exc_info)


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The JSON payloads of a server-sent event stream, until ``[DONE]``."""
    async for raw_line in resp.content:
        line = raw_line.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except ValueError:
            raise EngineError(f"a streamed event from {resp.url} is not JSON: {data[:_BODY_SNIPPET]!r}") from None


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (``None`` for an HTTP date or no header)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def snippet(raw: bytes) -> str:
    """The start of a body, for error messages."""
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= _BODY_SNIPPET else text[:_BODY_SNIPPET] + "..."


def error_text(raw: bytes) -> str:
    """The message of an error body (``{"error": {"message"}}``, ``{"error": "..."}``,
    ``{"detail"}`` or ``{"message"}``), else its start."""
    try:
        body = json.loads(raw)
    except ValueError:
        return snippet(raw) or "(empty body)"
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
    return snippet(raw)
