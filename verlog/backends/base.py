"""The one interface every inference engine speaks: token ids in, token ids and logprobs out.

verlog never sends text to an engine and never re-tokenizes what an engine produced: the chat
model renders the prompt to ids once, and the ids and logprobs an engine returns are what a
training turn stores.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import json
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Coroutine, Literal, Mapping, TypeVar, get_args

FinishReason = Literal["stop", "length", "abort"]

#: the grammar languages a :class:`Constraint` can be written in
ConstraintKind = Literal["json_schema", "regex", "lark"]
CONSTRAINT_KINDS: tuple[str, ...] = get_args(ConstraintKind)

T = TypeVar("T")


class EngineError(RuntimeError):
    """An engine could not produce a generation (bad request, server error, crashed worker)."""


class EngineTimeoutError(EngineError, TimeoutError):
    """An engine did not answer in time, after all retries."""


class UnsupportedConstraintError(EngineError):
    """A request carries a :class:`Constraint` this engine cannot enforce (it is never ignored)."""


class InvalidConstraintError(EngineError, ValueError):
    """A :class:`Constraint`'s grammar cannot be compiled (a malformed schema, regex or grammar)."""


class BlockingCallError(RuntimeError):
    """A sync model call (``invoke``, ``stream``, ``batch``) made on the thread of the event loop
    that must answer it: it would block that loop forever. Graph code, not the episode, is at
    fault, so runners stop at once instead of retrying."""


@dataclass(frozen=True)
class Constraint:
    """A grammar the response must follow, enforced by masking the tokens that would break it.

    ``kind`` says how ``grammar`` is written:

    * ``"json_schema"``: a JSON schema (as JSON text); the response is one JSON value it accepts;
    * ``"regex"``: a regular expression the whole response matches;
    * ``"lark"``: a Lark grammar in llguidance's dialect (``%json {schema}`` embeds a schema,
      ``<[id]>`` names a token id), for formats around JSON such as a Hermes tool call.

    Once the grammar is complete only an end-of-sequence token may follow. Sampling draws from
    the masked distribution and the logprobs an engine returns are that distribution's (forbidden
    tokens have probability 0, the rest are renormalized at the sampling temperature).
    """

    kind: ConstraintKind
    grammar: str

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"Constraint.kind must be one of {list(CONSTRAINT_KINDS)}, got {self.kind!r}")
        if not isinstance(self.grammar, str) or not self.grammar.strip():
            raise ValueError(f"Constraint.grammar must be a non-empty string, got {self.grammar!r:.80}")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.grammar)
            except json.JSONDecodeError as exc:
                raise ValueError(f"a json_schema Constraint's grammar must be JSON text: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"a JSON schema is an object or a boolean, got {type(schema).__name__}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> "Constraint":
        """The constraint that the response is one JSON value valid under ``schema``."""
        return cls("json_schema", json.dumps(schema, ensure_ascii=False))


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response.

    ``temperature == 0`` means greedy decoding. ``stop`` strings end the response after the token
    that completes them (the token is kept: ids are never cut); ``stop_token_ids`` (plus the
    model's end-of-sequence ids, added by each engine) end it after that token. ``constraint``
    (optional) is a grammar the response must follow: an engine enforces it by token masking
    or, if it cannot (see :attr:`Engine.constraint_kinds`), refuses the request with
    :class:`UnsupportedConstraintError`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be a verlog Constraint or None, got {type(self.constraint).__name__}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


@dataclass
class Generation:
    """What an engine produced for one prompt: exactly its token ids, one logprob per token."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    #: engine-specific extras (e.g. SGLang's ``meta_info``); never needed for training
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise EngineError(f"engine returned {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


@dataclass(frozen=True)
class ImageInputs:
    """A prompt's images for a vision-language model: ``images``, the encoded files in prompt
    order (what a turn keeps), and ``tensors``, the model processor's pixel inputs made from them
    (``pixel_values`` and the like: what the model's forward pass takes with the prompt ids)."""

    images: tuple[bytes, ...]
    tensors: Mapping[str, Any]


@dataclass(frozen=True)
class TokenDelta:
    """The tokens an engine chose since the previous item of a :meth:`Engine.stream`."""

    token_ids: list[int]
    logprobs: list[float]


class Engine(abc.ABC):
    """An inference engine: ``await engine.generate(prompt_ids, sampling)``.

    Implementations must be safe to call concurrently from many coroutines, and from several
    event loops (a sync LangChain call runs its own loop).

    A request whose ``sampling.constraint`` is of a kind outside :attr:`constraint_kinds` is
    refused with :class:`UnsupportedConstraintError` before the engine sees it: every subclass's
    ``generate`` and ``stream`` are wrapped to check, so no engine ignores a grammar silently.
    """

    #: the :class:`Constraint` kinds this engine enforces (none unless an engine says so)
    constraint_kinds: frozenset[str] = frozenset()

    #: whether ``generate``/``stream`` take ``images=`` (:class:`ImageInputs`): a vision-language
    #: model's engine; a call with images to an engine without is refused by the chat model
    accepts_images: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("generate", "stream"):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_checks_constraint", False):
                setattr(cls, name, _checking_constraint(method))

    def check_constraint(self, sampling: SamplingParams) -> None:
        """Raise :class:`UnsupportedConstraintError` if this engine cannot enforce ``sampling``'s
        constraint."""
        c = sampling.constraint
        if c is not None:
            self._check_kind(c)

    def validate_constraint(self, constraint: Constraint) -> None:
        """Check ahead of a request that this engine can enforce ``constraint``: raises
        :class:`UnsupportedConstraintError`, or :class:`InvalidConstraintError` where the engine
        compiles grammars itself and this one does not compile (may take a while the first time:
        call it off the event loop)."""
        self._check_kind(constraint)

    def _check_kind(self, c: Constraint) -> None:
        if c.kind not in self.constraint_kinds:
            can = ", ".join(sorted(self.constraint_kinds)) or "none"
            raise UnsupportedConstraintError(
                f"{type(self).__name__} cannot enforce a {c.kind!r} constraint (kinds it enforces: {can}); "
                "use an engine that can (the embedded engine enforces json_schema, regex and lark) or drop the "
                "constraint (tool_choice / response_format)"
            )

    #: whether a sync call may run this engine on the calling thread's own event loop; an engine
    #: holding loop-bound state (HTTP sessions) says no, and sync calls share one bridge loop
    sync_on_thread_loop: bool = True

    def sync_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop a sync call (``model.invoke`` in a ``def`` node) runs this engine's
        coroutines on: ``None`` for the calling thread's own, verlog's bridge loop when
        :attr:`sync_on_thread_loop` is False; an engine whose calls must all run on one loop (the
        training runner's gate) returns that loop."""
        return None if self.sync_on_thread_loop else sync_bridge_loop()

    #: token ids that end a generation for this engine's model (used when rendering stops)
    eos_token_ids: tuple[int, ...] = ()

    @abc.abstractmethod
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Generation:
        """Generate one response for ``prompt_ids``.

        ``request_id`` groups the calls of one episode (servers route them to the same replica so
        the prefix cache is reused); engines without routing ignore it.
        """

    async def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> AsyncIterator[TokenDelta | Generation]:
        """Generate one response, yielding :class:`TokenDelta` items as tokens are chosen, then
        the whole :class:`Generation` as the last item (the same one :meth:`generate` returns).

        For token streaming (a chat server). Closing the iterator early stops the generation
        where the engine can. This default, for engines that cannot stream, yields every token in
        one delta once the generation is done (``images`` passed on to an engine that takes them).
        """
        with_images = {} if images is None else {"images": images}
        generation = await self.generate(prompt_ids, sampling, request_id=request_id, **with_images)
        if generation.token_ids:
            yield TokenDelta(list(generation.token_ids), list(generation.logprobs))
        yield generation

    def stop_token_ids(self, sampling: SamplingParams) -> list[int]:
        """The token ids that end this generation: the request's and the model's end of sequence."""
        return sorted(set(sampling.stop_token_ids) | set(self.eos_token_ids))

    async def aclose(self) -> None:  # noqa: B027 (a hook: an engine holding nothing has nothing to release)
        """Release resources (threads, HTTP sessions)."""


def _checking_constraint(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an engine's ``generate`` or ``stream``), first checking the request's constraint.

    The wrapper is a plain function returning what ``method`` returns (a coroutine or an async
    generator), so an async generator is handed over unwrapped and closing it early still
    reaches the engine's own cleanup at once."""

    @functools.wraps(method)
    def wrapper(self: Engine, prompt_ids: list[int], sampling: SamplingParams, *args: Any, **kwargs: Any) -> Any:
        self.check_constraint(sampling)
        return method(self, prompt_ids, sampling, *args, **kwargs)

    wrapper._checks_constraint = True  # type: ignore[attr-defined]
    return wrapper


def ends_with_stop(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> bool:
    """Whether the text of the last tokens of ``ids`` contains a stop string (only a tail short
    enough to hold the longest stop is decoded, so checking after every token stays cheap)."""
    longest = max(len(s) for s in stops)
    tail = tokenizer.decode(ids[-(2 * longest + 4) :], skip_special_tokens=False)
    return any(s in tail for s in stops)


def cut_at_stop(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> int | None:
    """The length of the shortest prefix of ``ids`` whose text contains a stop string (``None``
    if none does): for servers that return tokens past a stop string."""
    if not stops or not ids or not any(s in tokenizer.decode(ids, skip_special_tokens=False) for s in stops):
        return None
    return next((n for n in range(1, len(ids) + 1) if ends_with_stop(tokenizer, ids[:n], stops)), None)


class _SyncBridge:
    """One event loop in a daemon thread that runs the coroutines of sync calls.

    A sync LangChain call (``model.invoke`` in a ``def`` node) blocks its own thread on a
    thread-safe future while its coroutine runs here, instead of paying a fresh event loop per
    call (``asyncio.run`` costs about 1.5 ms) and without creating loop-bound objects (events,
    HTTP sessions) that nothing else could ever wake or reuse.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=serve, name="verlog-sync-bridge", daemon=True).start()
                ready.wait()
                self._loop = loop
            return self._loop


_BRIDGE = _SyncBridge()


def sync_bridge_loop() -> asyncio.AbstractEventLoop:
    """verlog's one event loop (in a daemon thread) for sync calls that must share a loop."""
    return _BRIDGE.loop()


_THREAD_LOOPS = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's own event loop for sync calls, made on first use and kept (creating one per
    call costs about 1.5 ms)."""
    loop = getattr(_THREAD_LOOPS, "loop", None)
    if loop is None or loop.is_closed():
        loop = _THREAD_LOOPS.loop = asyncio.new_event_loop()
    return loop


def run_sync(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """Run ``coro`` to completion from synchronous code and return its result.

    The coroutine runs on ``loop`` if given (e.g. the loop that owns an engine's state; the
    calling thread parks on a thread-safe future meanwhile). Otherwise it runs on this thread's
    own kept loop, or, when this thread is already running a loop (a sync call inside async
    code), on verlog's sync-bridge loop in another thread. Calling this on the thread of the
    loop that would run ``coro`` would block that loop forever: it is refused with a
    :class:`BlockingCallError` saying what to do instead.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None and running is None:
        return _thread_loop().run_until_complete(coro)
    target = loop or _BRIDGE.loop()
    if running is target:
        coro.close()
        raise BlockingCallError(_blocking_message("invoke"))
    return asyncio.run_coroutine_threadsafe(coro, target).result()


def check_sync_call(loop: asyncio.AbstractEventLoop | None, what: str) -> None:
    """Refuse, with :class:`BlockingCallError`, a sync ``model.<what>(...)`` whose coroutines must
    run on ``loop`` when it is made on the thread running ``loop`` (an ``async def`` node)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread: nothing to block
        return
    if running is loop:
        raise BlockingCallError(_blocking_message(what))


def _blocking_message(what: str) -> str:
    return (
        f"model.{what}(...) was called inside async code, on the event loop that must answer it, which would "
        f"block it forever: in an `async def` node use `await model.a{what}(...)`, or make the node a plain "
        "`def` (LangGraph runs those in threads)"
    )
