"""The embedded engine: a transformers model in this process, batching concurrent requests.

Many graphs run concurrently on one event loop, and each awaits its own model call. The engine
gathers the calls that are waiting at the same moment into one batch, prefills them together
(left-padded, one forward pass), then decodes all rows step by step with a KV cache, dropping
rows as they finish. Work runs on one worker thread so the event loop stays free to run graphs.

A prefix cache (:mod:`verlog.backends.prefix_cache`) keeps the KV of earlier prompts across
calls: a prefill computes only the tokens after the longest cached prefix of each prompt (a game's
instruction repeated every turn, the previous turn of a chat). It is cleared whenever a trainer
releases ``engine.weights_lock()``, so a generation never reads KV of other weights.

Logprobs are ``log_softmax(logits / temperature)`` of the chosen token (plain ``log_softmax`` for
greedy decoding), before any top-k / top-p truncation: the same quantity a trainer recomputes
with a teacher-forced forward pass.

A request with images (``images=``, :class:`~verlog.backends.base.ImageInputs`; a vision-language
model such as Idefics3/SmolVLM) is prefilled on its own with its pixel inputs, then decodes in the
batch like any row (its next tokens need only the KV). Its prompt neither reads nor fills the prefix
cache: the KV of an image's tokens depends on the pixels, which the ids do not name.

A request with a ``sampling.constraint`` (a JSON schema, regex or Lark grammar) is decoded under
a token mask (:mod:`verlog.backends.grammar`): before each choice the logits of tokens that would
break the grammar are set to ``-inf``, so the sample, and the logprob recorded for it, come from
the masked distribution. Requests without a constraint are never masked.

The decode step runs on the model's device as a few batched tensor ops, whatever the batch's mix
of settings (:mod:`verlog.backends.decode_rows`): sampling, top-k / top-p, each request's own
random stream, stop token ids and stop strings (:mod:`verlog.backends.stop_strings`), the grammar
masks of constrained rows. Per step only a ``[B]`` vector of stop flags is read back; a request's
tokens are copied out once, when it finishes. Python touches single rows only for what lives on
the host by nature: streaming callbacks, llguidance's matchers, and the rare request whose stop
strings no longer fit in the device table (checked on the host instead).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from verlog.backends.base import (
    CONSTRAINT_KINDS,
    Constraint,
    Engine,
    EngineError,
    Generation,
    ImageInputs,
    SamplingParams,
    TokenDelta,
    ends_with_stop,
)
from verlog.backends.decode_rows import DecodeRows, RowSpec, seed_stream, unpack_bitmask
from verlog.backends.grammar import ConstraintMatcher, GrammarCompiler, fill_masks
from verlog.backends.prefix_cache import PrefixCache
from verlog.backends.stop_strings import StopStrings
from verlog.tokens import common_prefix_len, eos_token_ids, pad_token_id

#: the prefix cache's default size: about 11,000 tokens of SmolLM2-135M's KV in float32
DEFAULT_PREFIX_CACHE_BYTES = 512 * 2**20


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    #: the start of its random stream (the request's seed; unseeded: drawn when admitted)
    seed: int | None = None
    #: called on the caller's loop with (token id, logprob) as each token is chosen
    on_token: Callable[[int, float], Any] | None = None
    #: start states of its stop strings in the engine's device table; ``None``: checked on the host
    stop_states: tuple[int, ...] | None = ()
    #: the tokens chosen so far, kept on the host only for rows that need them every step
    #: (stop strings checked on the host)
    host_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    #: the prefix cache's epoch when this request's KV began (stale KV is never inserted)
    cache_epoch: int = 0
    #: where the response stands in its constraint's grammar (constrained requests only)
    matcher: ConstraintMatcher | None = None
    #: a failure of this request alone (its constraint broke): reported instead of a generation
    error: EngineError | None = None
    #: the prompt's images (a vision-language model's request): prefilled alone, never cached
    images: ImageInputs | None = None

    @property
    def host_work(self) -> bool:
        """Whether its row needs the host every step (streaming, a grammar, host stop strings)."""
        return self.on_token is not None or self.matcher is not None or self.stop_states is None

    def resolve(self, ids: list[int], logprobs: list[float]) -> None:
        gen = Generation(ids, logprobs, self.finish_reason or "length")
        self.loop.call_soon_threadsafe(_set_result, self.future, gen)

    def fail(self, exc: BaseException) -> None:
        self.loop.call_soon_threadsafe(_set_exception, self.future, exc)


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


@dataclass
class EngineStats:
    """Counters for benchmarks and progress displays."""

    requests: int = 0
    #: forward passes that chose a token for every running request (prefills and decode steps)
    steps: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    #: prompt tokens run through the model (the rest were cached or shared)
    computed_prompt_tokens: int = 0
    #: prompt tokens whose KV came from the prefix cache (kept from earlier calls)
    cached_prompt_tokens: int = 0
    #: prompt tokens not recomputed because concurrent prompts shared them
    shared_prefix_tokens: int = 0
    #: requests whose prompt held images (each prefilled alone with its pixels), and their images
    image_requests: int = 0
    images: int = 0
    busy_s: float = 0.0
    #: of ``busy_s``: time in prefill passes (new prompts) and in decode steps
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def mean_batch_size(self) -> float:
        """Requests served per forward pass, on average."""
        return self.generated_tokens / self.steps if self.steps else 0.0

    @property
    def computed_fraction(self) -> float:
        """Prompt tokens computed / prompt tokens (1.0 without any cache or sharing)."""
        return self.computed_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class TokenStreamingEngine(Engine):
    """An engine whose ``generate`` takes ``on_token=`` (called on the caller's loop as each token
    is chosen): its :meth:`stream` is made of that (the embedded engine, in this process or its own)."""

    @abc.abstractmethod
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[int, float], Any] | None = None,
        images: ImageInputs | None = None,
    ) -> Generation: ...

    async def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> AsyncIterator[TokenDelta | Generation]:
        """Tokens as they are chosen (see :meth:`Engine.stream`); tokens chosen while the consumer
        was busy arrive together. Closing the iterator early cancels the generation (its batch row
        is freed)."""
        chosen: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        task = asyncio.ensure_future(
            self.generate(
                prompt_ids,
                sampling,
                request_id=request_id,
                on_token=lambda t, lp: chosen.put_nowait((t, lp)),
                images=images,
            )
        )
        task.add_done_callback(lambda _: chosen.put_nowait(None))
        try:
            while (item := await chosen.get()) is not None:
                ids, logprobs = [item[0]], [item[1]]
                while not chosen.empty():
                    nxt = chosen.get_nowait()
                    if nxt is None:
                        chosen.put_nowait(None)
                        break
                    ids.append(nxt[0])
                    logprobs.append(nxt[1])
                yield TokenDelta(ids, logprobs)
            yield task.result()  # raises the engine's error, if any
        finally:
            task.cancel()  # the consumer stopped early: free the batch row


def torch_cpu_threads(requested: int | None = None) -> int:
    """Torch's CPU threads for a pass: ``requested``, else all cores but one (the one left to the
    event loop that runs the graphs: see ``EmbeddedEngine``'s ``cpu_threads``)."""
    return requested or max(1, (os.cpu_count() or 2) - 1)


class EmbeddedEngine(TokenStreamingEngine):
    """Runs a causal LM in-process with dynamic batching and a KV cache; enforces constraints.

    Args:
        model: a transformers causal LM (its weights may be updated in place between batches
            by a trainer holding ``engine.weights_lock()``).
        tokenizer: used to detect stop strings and to find the end-of-sequence / pad ids.
        max_batch_size: the most requests decoded together.
        batch_wait_ms: after the first waiting request, how long to wait for more to join.
        max_context: prompt + response token limit (default: the model's max positions).
        cpu_threads: torch's intra-op threads when the model runs on the CPU. The default leaves
            one core to the event loop that runs the graphs: torch's worker threads spin while
            waiting, and competing with a busy Python thread for every core slows a forward
            pass a hundredfold on small machines. Set on the engine's worker thread only.
        min_shared_prefix: prompts joining together that share at least this many leading
            tokens compute them once.
        admit_wait_steps: a few requests arriving while a large batch decodes wait up to this
            many decode steps for others to join them (one prefill pass instead of several).
        prefix_cache_bytes: the most bytes of KV the prefix cache keeps across calls (prompts
            and generated tokens of finished requests, least recently used evicted first);
            ``0`` turns it off. Generations are the same with and without it.
        autocast: the compute dtype of the model's forward passes (``torch.autocast``), e.g.
            ``torch.bfloat16`` over a trainer's float32 master weights; ``None``: the weights' own.
        step_lock: what each batch step holds instead of the engine's own weights lock (a lock
            another process holds while it changes the weights: see ``EngineProcess``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        batch_wait_ms: float = 2.0,
        max_context: int | None = None,
        seed: int = 0,
        cpu_threads: int | None = None,
        min_shared_prefix: int = 16,
        admit_wait_steps: int = 4,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        autocast: torch.dtype | None = None,
        step_lock: contextlib.AbstractContextManager | None = None,
    ):
        self.model = model.eval()
        self.autocast = autocast
        self.cpu_threads = torch_cpu_threads(cpu_threads)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.min_shared_prefix = min_shared_prefix
        self.admit_wait_steps = admit_wait_steps
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config  # (a VLM's)
        self.max_context = max_context or getattr(text_config, "max_position_embeddings", None) or 1 << 30
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self.pad_id = pad_token_id(tokenizer, self.eos_token_ids)
        self.stats = EngineStats()
        if prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0 (0 turns the cache off), got {prefix_cache_bytes}")
        #: KV of earlier prompts, reused by later prefills (cleared when the weights change)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._default_generator = torch.Generator(device="cpu").manual_seed(seed)
        vocab = getattr(config, "vocab_size", None) or len(tokenizer)
        #: the stop strings of requests, as a device table (built as strings first appear)
        self.stop_strings = StopStrings(tokenizer, vocab, self.device)
        self._grammar: GrammarCompiler | None = None
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        #: requests their callers cancelled (their rows are freed at the next step)
        self._cancelled: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._weights_lock = threading.Lock()
        self._step_lock = step_lock if step_lock is not None else self._weights_lock
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="verlog-embedded-engine", daemon=True)
        self._worker.start()

    #: any :class:`~verlog.backends.base.Constraint` is enforced by token masking (llguidance)
    constraint_kinds = frozenset(CONSTRAINT_KINDS)

    @property
    def accepts_images(self) -> bool:  # type: ignore[override]
        """Whether the model takes images: a vision-language model whose positions are plain
        1-D ones (Idefics3/SmolVLM, LLaVA-style). Models with multimodal rotary positions
        (Qwen2-VL's 3-D M-RoPE) are not served with images yet."""
        return _image_model_problem(self.model) is None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def validate_constraint(self, constraint: Constraint) -> None:
        """Compile ``constraint`` now (kept for the requests that use it); raises
        :class:`~verlog.backends.base.InvalidConstraintError` if it does not compile."""
        super().validate_constraint(constraint)
        self._grammar_compiler().matcher(constraint)

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammar is None:
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None) or len(self.tokenizer)
            self._grammar = GrammarCompiler(self.tokenizer, vocab, self.eos_token_ids)
        return self._grammar

    # ------------------------------------------------------------------ public API
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[int, float], Any] | None = None,
        images: ImageInputs | None = None,
    ) -> Generation:
        """Generate one response (see :meth:`Engine.generate`).

        ``on_token(token_id, logprob)``, if given, is called on the caller's event loop as each
        token is chosen, before the returned generation completes (for token streaming).
        ``images``: the prompt's images (a vision-language model; see the module doc).
        Cancelling the call frees its batch row at the next decode step.
        """
        if self._closed:
            raise EngineError("the embedded engine is closed")
        if images is not None and (problem := _image_model_problem(self.model)) is not None:
            raise EngineError(f"this request has images, and {problem}")
        if not prompt_ids:
            raise EngineError("prompt_ids is empty")
        if len(prompt_ids) + 1 > self.max_context:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens leaves no room to generate within the "
                f"engine's max_context of {self.max_context} tokens"
            )
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), sampling, loop, loop.create_future(), on_token=on_token, images=images)
        if sampling.seed is not None:
            req.seed = seed_stream(sampling.seed)
        if sampling.stop:  # new stop strings join the device table off the loop
            states = self.stop_strings.known(sampling.stop)
            if states is None:
                states = await asyncio.to_thread(self.stop_strings.start_states, sampling.stop)
            req.stop_states = None if states is None else tuple(states)
        if sampling.constraint is not None:  # compiled off the loop; a bad grammar fails this call only
            req.matcher = await asyncio.to_thread(self._grammar_compiler().matcher, sampling.constraint)
        req.future.add_done_callback(lambda fut: self._cancelled.put(req) if fut.cancelled() else None)
        self._queue.put(req)
        return await req.future

    @property
    def sampling_generator(self) -> torch.Generator:
        """The random stream of unseeded sampling (a trainer checkpoints it for exact resumes)."""
        return self._default_generator

    @contextlib.contextmanager
    def weights_lock(self) -> Iterator[None]:
        """Hold this while changing the model's weights: no batch runs meanwhile.

        The prefix cache is cleared on entry (its memory is free for the update) and again on
        release (its KV belongs to the weights before); KV of requests that were decoding
        meanwhile is never put back into it.
        """
        with self._weights_lock:
            self.prefix_cache.clear()
            try:
                yield
            finally:
                self.prefix_cache.clear()

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._worker.join(timeout=10)

    # ------------------------------------------------------------------ worker thread
    def _serve(self) -> None:
        """Continuous batching: new requests join the running batch at the next decode step."""
        if self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)  # OpenMP settings are per thread: set it here
        running: _Running | None = None
        backlog: list[_Request] = []
        waited = 0  # decode steps the backlog has waited
        while True:
            arrived = self._collect(block=running is None and not backlog)
            if arrived is None:  # closed
                for req in backlog + (running.requests if running else []):
                    req.fail(EngineError("the embedded engine was closed"))
                return
            backlog += arrived
            busy = len(running.requests) if running else 0
            room = self.max_batch_size - busy
            # Each admission costs a prefill pass and a cache merge: let a few stragglers gather
            # (they arrive in bursts as episodes step their games) unless the batch runs thin.
            due = waited >= self.admit_wait_steps or 4 * len(backlog) >= busy or len(backlog) >= room
            admit, backlog = (backlog[:room], backlog[room:]) if due else ([], backlog)
            admit = [r for r in admit if not r.future.done()]  # cancelled while waiting: dropped
            waited = 0 if admit or not backlog else waited + 1
            started = time.perf_counter()
            try:
                with self._step_lock, torch.inference_mode(), self._compute():
                    if admit:
                        joined = self._prefill(admit)
                        if joined.requests:
                            running = joined if running is None else running.merge(joined)
                    prefilled = time.perf_counter()
                    self.stats.prefill_s += prefilled - started
                    if running is not None and running.requests:
                        self._decode_step(running)
                        self.stats.decode_s += time.perf_counter() - prefilled
            except Exception as exc:  # report to every caller in flight, keep serving
                err = exc if isinstance(exc, EngineError) else EngineError(f"embedded engine failed: {exc!r}")
                for req in admit + (running.requests if running else []):
                    req.fail(err)
                running = None
                continue
            self.stats.busy_s += time.perf_counter() - started
            if running is not None and not running.requests:
                running = None

    def _compute(self) -> contextlib.AbstractContextManager:
        """The forward passes' precision: autocast to ``self.autocast``, or the weights' dtype."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def _collect(self, *, block: bool) -> list[_Request] | None:
        """Requests waiting now; when idle, block for one and give others ``batch_wait`` to join."""
        got: list[_Request] = []
        try:
            first = self._queue.get() if block else self._queue.get_nowait()
        except queue.Empty:
            return got
        if first is None:
            return None
        got.append(first)
        deadline = time.perf_counter() + (self.batch_wait_s if block else 0.0)
        while True:
            remaining = deadline - time.perf_counter()
            try:
                req = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                return got
            if req is None:
                self._queue.put(None)  # seen again on the next call
                return got
            got.append(req)

    def _prefill(self, batch: list[_Request]) -> "_Running":
        """Prefill new prompts (one forward pass, or a few when the parts they compute differ
        much in length: padding costs compute); picks each one's first token.

        Each prompt starts from the longest prefix the prefix cache holds for it (at least one
        token of its own is always computed, so its first logits exist). Prompts of concurrent
        episodes often share a long start (the system prompt, the game's instructions): the part
        of that common prefix nobody has cached is run once and its KV shared by every row. Each
        row is laid out as ``[left pad | prefix KV] + [left pad | its own tokens]``; the attention
        mask and explicit position ids make the padding in the middle invisible.

        A prompt whose prefix KV covers all but its last token (the next turn of a game whose
        instructions and history are cached) needs no pass of its own: its row joins with that KV
        and its last token is fed with the running rows' tokens at the next decode step, which
        picks its first token (``_waiting_rows``). The returned batch then holds such rows too.
        """
        if any(r.images is not None for r in batch):
            return self._prefill_with_images(batch)
        device, cache_store = self.device, self.prefix_cache
        prompts = [r.prompt_ids for r in batch]
        unseeded = [r for r in batch if r.seed is None]
        if unseeded:  # each unseeded request's stream starts from the engine's generator
            starts = torch.randint(-(2**63), 2**63 - 1, (len(unseeded),), generator=self._default_generator)
            for r, start in zip(unseeded, starts.tolist()):
                r.seed = start
        for r in batch:
            r.cache_epoch = cache_store.epoch
        hits = [cache_store.match(p, len(p) - 1) if cache_store.enabled else (0, None) for p in prompts]
        prefix: list[tuple[int, torch.Tensor | None]] = list(hits)
        computed_once = 0
        # the rows not covered by a longer cached prefix share a common start: compute it once
        rest = list(range(len(batch)))
        if len(batch) > 1:
            shared = _shared_start(prompts)
            rest = [i for i in rest if hits[i][0] < shared] or rest
            shared = _shared_start([prompts[i] for i in rest]) if len(rest) > 1 else 0
            base, base_kv = hits[rest[0]]
            if len(rest) > 1 and shared - base >= max(1, self.min_shared_prefix):
                kv = self._extend(prompts[rest[0]][:shared], base, base_kv)
                cache_store.insert(
                    prompts[rest[0]][:shared], lambda a, b: kv[:, :, :, a:b].clone(), epoch=batch[0].cache_epoch
                )
                for i in rest:
                    prefix[i] = (shared, kv)
                computed_once = shared - base
                self.stats.shared_prefix_tokens += computed_once * (len(rest) - 1)
        lengths = [n for n, _ in prefix]
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.cached_prompt_tokens += sum(min(h, n) for (h, _), n in zip(hits, lengths))
        self.stats.computed_prompt_tokens += computed_once + sum(len(p) - n for p, n in zip(prompts, lengths))
        self.stats.requests += len(batch)
        # one own token after a cached prefix: fed at the next decode step, no pass of its own
        deferred = [i for i, (p, n) in enumerate(zip(prompts, lengths)) if n >= 1 and len(p) - n == 1]
        passed = sorted(set(range(len(batch))) - set(deferred))
        running: _Running | None = None
        if passed:
            # rows whose own parts differ much in length run in separate passes (padding costs compute)
            overhead = _PASS_OVERHEAD_TOKENS.get(device.type, _PASS_OVERHEAD_TOKENS["cuda"])
            all_logits = []
            for rows in _pack_by_length([len(prompts[i]) - lengths[i] for i in passed], overhead):
                chosen = [passed[r] for r in rows]
                part, logits = self._prefill_rows([batch[i] for i in chosen], [prefix[i] for i in chosen])
                running = part if running is None else running.merge(part)
                all_logits.append(logits)
            assert running is not None
            if cache_store.enabled:
                self._keep_prefixes(
                    running, [(row, req.prompt_ids, req.cache_epoch) for row, req in enumerate(running.requests)]
                )
            self._advance(running, torch.cat(all_logits))
        if deferred:
            waiting = self._waiting_rows([batch[i] for i in deferred], [prefix[i] for i in deferred])
            running = waiting if running is None or not running.requests else running.merge(waiting)
        assert running is not None
        return running

    def _prefill_with_images(self, batch: list[_Request]) -> "_Running":
        """Prefill a batch holding requests with images: the others as usual, then each request
        with images in a pass of its own (its pixel inputs with its ids, no prefix cache)."""
        plain = [r for r in batch if r.images is None]
        running = self._prefill(plain) if plain else None
        for r in batch:
            if r.images is None:
                continue
            if r.seed is None:  # its random stream starts from the engine's generator, as others'
                r.seed = int(torch.randint(-(2**63), 2**63 - 1, (1,), generator=self._default_generator))
            r.cache_epoch = self.prefix_cache.epoch
            self.stats.prompt_tokens += len(r.prompt_ids)
            self.stats.computed_prompt_tokens += len(r.prompt_ids)
            self.stats.requests += 1
            self.stats.image_requests += 1
            self.stats.images += len(r.images.images)
            pixels = {k: v.to(self.device) for k, v in r.images.tensors.items()}
            part, logits = self._prefill_rows([r], [(0, None)], pixels)
            self._advance(part, logits)
            if part.requests:
                running = part if running is None or not running.requests else running.merge(part)
        return running if running is not None else part

    def _waiting_rows(self, batch: list[_Request], prefix: list[tuple[int, torch.Tensor | None]]) -> "_Running":
        """Rows whose prefix KV covers all of their prompt but its last token: the KV is laid in
        (right-aligned), the last token waits to be fed at the next decode step."""
        device = self.device
        width = max(n for n, _ in prefix)
        cache = _new_cache(self.model.config)
        _load_prefixes(cache, prefix, width)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (n, _) in enumerate(prefix):
            attention[i, width - n :] = 1
        positions = torch.tensor([n for n, _ in prefix])  # the last prompt token's position
        last = torch.tensor([r.prompt_ids[-1] for r in batch])
        rows = DecodeRows([self._row_spec(r) for r in batch], device)
        return _Running(
            list(batch), cache, attention.to(device), positions.to(device), rows, next_tokens=last.to(device)
        )

    def _prefill_rows(
        self,
        batch: list[_Request],
        prefix: list[tuple[int, torch.Tensor | None]],
        pixels: dict[str, torch.Tensor] | None = None,
    ) -> tuple["_Running", torch.Tensor]:
        """One forward pass over ``batch``'s prompts, each after its prefix KV; the last logits.
        ``pixels``: the one request's image inputs (a vision-language model's prompt)."""
        device = self.device
        prompts = [r.prompt_ids for r in batch]
        lengths = [n for n, _ in prefix]
        width_kv = max(lengths)
        cache = _new_cache(self.model.config)
        if width_kv:
            _load_prefixes(cache, prefix, width_kv)
        width = max(len(p) - n for p, n in zip(prompts, lengths))
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width_kv + width), dtype=torch.long)
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            attention[i, width_kv - n : width_kv] = 1
            input_ids[i, width - (len(p) - n) :] = torch.tensor(p[n:])
            attention[i, width_kv + width - (len(p) - n) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, width_kv:]
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **(pixels or {}),
        ).logits[:, -1, :]
        rows = DecodeRows([self._row_spec(r) for r in batch], device)
        return _Running(list(batch), cache, attention, positions[:, -1] + 1, rows), logits

    def _row_spec(self, r: _Request) -> RowSpec:
        s = r.sampling
        assert r.seed is not None
        return RowSpec(
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            seed=r.seed,
            limit=min(s.max_new_tokens, self.max_context - len(r.prompt_ids)),
            stop_ids=tuple(sorted(set(self.eos_token_ids) | set(s.stop_token_ids))),
            stop_states=r.stop_states or (),
        )

    def _extend(self, tokens: list[int], start: int, start_kv: torch.Tensor | None) -> torch.Tensor:
        """The KV of ``tokens`` (one row), computing those after the first ``start`` (whose KV
        is ``start_kv``): ``[layers, 2, kv_heads, len(tokens), head_dim]``."""
        cache = _new_cache(self.model.config)
        if start:
            _load_prefixes(cache, [(start, start_kv)], start)
        self.model(
            input_ids=torch.tensor([tokens[start:]], device=self.device),
            position_ids=torch.arange(start, len(tokens), device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])

    def _keep_prefixes(self, running: "_Running", kept: list[tuple[int, list[int], int]]) -> None:
        """Put the KV of batch rows in the prefix cache: ``kept`` holds ``(row, tokens, epoch)``,
        ``tokens`` the ids fed so far to that row. Only the tokens the cache lacks are copied (a
        finished answer after its cached prompt, say), for all rows at once: one gather per layer
        tensor, whatever the number of rows."""
        store = self.prefix_cache
        kept = [(row, tokens, epoch) for row, tokens, epoch in kept if tokens and epoch == store.epoch]
        if not kept:
            return
        starts = [store.cached_len(tokens) for _, tokens, _ in kept]
        lacking = [i for i, ((_, tokens, _), start) in enumerate(zip(kept, starts)) if start < len(tokens)]
        if not lacking:
            return
        device = running.attention.device
        index = torch.tensor([kept[i][0] for i in lacking], device=device)
        mask = running.attention.index_select(0, index)
        held = mask.sum(1).tolist()
        for i, n in zip(lacking, held):
            if n != len(kept[i][1]):
                raise EngineError(f"internal: row {kept[i][0]} holds {n} cached tokens, expected {len(kept[i][1])}")
        # each row's columns from its first token the cache lacks (rank: the token's place in the row)
        rank = mask.cumsum(1) - 1
        first = torch.tensor([starts[i] for i in lacking], device=device)
        rows, columns = ((mask > 0) & (rank >= first[:, None])).nonzero(as_tuple=True)
        rows = index[rows]
        # [layers * 2, tokens of all rows, kv_heads, head_dim]
        flat = torch.stack([t[rows, :, columns] for layer in running.cache.layers for t in (layer.keys, layer.values)])
        offsets, at = {}, 0
        for i in lacking:
            offsets[i] = at
            at += len(kept[i][1]) - starts[i]

        for i, (row, tokens, epoch) in enumerate(kept):

            def kv_for(a: int, b: int, i: int = i, row: int = row) -> torch.Tensor:
                if i in offsets and a >= starts[i]:  # (the cache may have grown since: never shrunk)
                    part = flat[:, offsets[i] + a - starts[i] : offsets[i] + b - starts[i]]
                    out = part.new_empty((part.shape[0], part.shape[2], b - a, part.shape[3]))
                    return out.copy_(part.transpose(1, 2)).unflatten(0, (-1, 2))
                return self._row_kv(running, row, a, b)  # evicted meanwhile: copied on its own

            store.insert(tokens, kv_for, epoch=epoch)

    def _row_kv(self, running: "_Running", row: int, start: int, end: int) -> torch.Tensor:
        """The KV of tokens ``start:end`` of batch row ``row``: ``[layers, 2, kv_heads, end - start, head_dim]``."""
        idx = running.attention[row].nonzero()[start:end, 0]
        return torch.stack(
            [
                torch.stack([layer.keys[row].index_select(1, idx), layer.values[row].index_select(1, idx)])
                for layer in running.cache.layers
            ]
        )

    def _decode_step(self, running: "_Running") -> None:
        """Feed each running request its last chosen token; choose the next one."""
        running.attention = torch.cat(
            [running.attention, running.attention.new_ones((len(running.requests), 1))], dim=1
        )
        logits = self.model(
            input_ids=running.next_tokens[:, None],
            attention_mask=running.attention,
            position_ids=running.next_pos[:, None],
            past_key_values=running.cache,
            use_cache=True,
        ).logits[:, -1, :]
        running.next_pos = running.next_pos + 1
        self._advance(running, logits)

    def _advance(self, running: "_Running", logits: torch.Tensor) -> None:
        """Choose a token for every row (on the device), resolve the requests that finished and
        drop their rows."""
        reqs, rows = running.requests, running.rows
        tokens, logprobs, stopped = rows.choose(
            logits, self.stop_strings, self._grammar_masks(running, logits.shape[1])
        )
        self.stats.steps += 1
        self.stats.generated_tokens += len(reqs)
        # the one read-back per step: which rows completed a stop (lengths are counted on the host)
        # and which chose from logits that are not finite (broken weights: a NaN logprob)
        stop, broken = torch.stack([stopped, logprobs.isnan()]).cpu().numpy()
        abort = broken.copy()
        for row in np.flatnonzero(broken).tolist():
            reqs[row].error = reqs[row].error or EngineError(
                "the model's logits are not finite (NaN): its weights are broken (a diverged update?)"
            )
        if running.host_rows:
            self._host_work(running, tokens, logprobs, stop, abort)
        while not self._cancelled.empty():
            gone = self._cancelled.get()
            abort |= np.fromiter((r is gone for r in reqs), dtype=bool, count=len(reqs))
        ended = stop | abort | rows.at_limit()
        running.next_tokens = tokens
        if not ended.any():
            return
        finished = np.flatnonzero(ended).tolist()
        kept: list[tuple[int, list[int], int]] = []
        for row, (ids, lps) in zip(finished, rows.outputs(finished)):
            req = reqs[row]
            req.finish_reason = "abort" if abort[row] else "stop" if stop[row] else "length"
            if req.error is not None:
                req.fail(req.error)
                continue
            req.resolve(ids, lps)
            if self.prefix_cache.enabled and not abort[row] and req.images is None:
                # the prompt and the answer's tokens fed so far: the next turn of a chat extends them
                kept.append((row, req.prompt_ids + ids[:-1], req.cache_epoch))
        self._keep_prefixes(running, kept)
        running.select(np.flatnonzero(~ended).tolist())

    def _grammar_masks(self, running: "_Running", width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The tokens each constrained row's grammar allows next (llguidance fills packed masks on
        the host, one copy takes them to the device). A row whose grammar fails is left unmasked
        and ends with its error."""
        rows = [
            row
            for row in running.host_rows
            if running.requests[row].matcher is not None and running.requests[row].error is None
        ]
        if not rows:
            return None
        reqs = [running.requests[row] for row in rows]
        bitmask, errors = fill_masks([r.matcher for r in reqs])
        for r, error in zip(reqs, errors):
            r.error = r.error or error
        ok = [i for i, e in enumerate(errors) if e is None]
        if not ok:
            return None
        masks = unpack_bitmask(bitmask[ok].to(self.device, non_blocking=True), width)
        return torch.tensor([rows[i] for i in ok], device=self.device), masks

    def _host_work(
        self, running: "_Running", tokens: torch.Tensor, logprobs: torch.Tensor, stop: np.ndarray, abort: np.ndarray
    ) -> None:
        """What rows needing the host do with their new token: stream it, advance their grammar,
        check stop strings that are not in the device table."""
        rows = running.host_rows
        index = torch.tensor(rows, device=tokens.device)
        for row, token, logprob in zip(rows, tokens[index].tolist(), logprobs[index].tolist()):
            r = running.requests[row]
            if r.on_token is not None:
                r.loop.call_soon_threadsafe(r.on_token, token, logprob)
            s = r.sampling
            if r.matcher is not None and r.error is None and not stop[row]:
                try:  # an end token needs no telling
                    r.matcher.accept(token)
                except EngineError as exc:
                    r.error = exc
            if r.stop_states is None:
                r.host_ids.append(token)
                stop[row] |= ends_with_stop(self.tokenizer, r.host_ids, s.stop)
            abort[row] |= r.error is not None


class _GrowingLayer(DynamicLayer):
    """A KV-cache layer with spare room at the end: a decode step writes its key and value in
    place instead of copying the whole cache (``torch.cat``) as ``DynamicLayer`` does.

    ``keys``/``values`` read as the filled part (a view kept between steps, not a new slice at
    every read); assigning either replaces its buffer (used by batch selection and merging),
    each with its own length.
    """

    def __init__(self) -> None:
        self._buf: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        #: the filled part of each buffer
        self._view: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        super().__init__()

    def _set(self, name: str, value: torch.Tensor | None) -> None:
        self._buf[name] = self._view[name] = value

    keys = property(lambda self: self._view["keys"], lambda self, v: self._set("keys", v))  # type: ignore[assignment]
    values = property(lambda self: self._view["values"], lambda self, v: self._set("values", v))  # type: ignore[assignment]

    def get_seq_length(self) -> int:
        keys = self._view["keys"]
        return 0 if not self.is_initialized or keys is None or keys.numel() == 0 else keys.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        for name, new in (("keys", key_states), ("values", value_states)):
            buf, view = self._buf[name], self._view[name]
            used = 0 if view is None else view.shape[-2]
            if buf is None or used == 0:
                self._set(name, new)
                continue
            n = new.shape[-2]
            if used + n > buf.shape[-2]:  # grow by doubling: amortized O(1) copies per token
                grown = buf.new_empty((*buf.shape[:2], max(2 * buf.shape[-2], used + n), buf.shape[-1]))
                grown.narrow(2, 0, used).copy_(view)
                self._buf[name] = buf = grown
            buf.narrow(2, used, n).copy_(new)
            self._view[name] = buf.narrow(2, 0, used + n)
        return self._view["keys"], self._view["values"]


def _image_model_problem(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot be served with images here (``None``: it can)."""
    config = getattr(model, "config", None)
    if getattr(config, "vision_config", None) is None:
        return f"{type(model).__name__} is a text model (a vision-language model takes images, e.g. 'tiny-vl')"
    if hasattr(getattr(model, "model", None), "get_rope_index"):
        return (
            f"{type(model).__name__}'s multimodal rotary positions (M-RoPE) are not handled by the embedded engine "
            "yet; serve it with images through SGLang, or use a model with 1-D positions (Idefics3/SmolVLM)"
        )
    return None


def _new_cache(config: Any) -> DynamicCache:
    cache = DynamicCache(config=config)
    cache.layers = [_GrowingLayer() for _ in cache.layers]
    return cache


def _load_prefixes(cache: DynamicCache, prefixes: list[tuple[int, torch.Tensor | None]], width: int) -> None:
    """Fill an empty cache with one prefix KV per row (``(length, [layers, 2, heads, >= length,
    dim])``), each right-aligned in ``width`` columns (zeros before it, masked by the caller)."""
    kv = next(t for n, t in prefixes if n)
    assert kv is not None
    layers, _, heads, _, dim = kv.shape
    stacked = kv.new_zeros((layers, 2, len(prefixes), heads, width, dim))
    for row, (n, t) in enumerate(prefixes):
        if n:
            assert t is not None
            stacked[:, :, row, :, width - n :] = t[:, :, :, :n]
    if layers != len(cache.layers):
        raise EngineError(f"internal: cached KV has {layers} layers, the model {len(cache.layers)}")
    for i, layer in enumerate(cache.layers):
        layer.dtype, layer.device, layer.is_initialized = kv.dtype, kv.device, True
        layer.keys, layer.values = stacked[i, 0], stacked[i, 1]


@dataclass
class _Running:
    """The batch being decoded: its requests, their shared KV cache and attention mask, and
    their decode state on the device (:class:`~verlog.backends.decode_rows.DecodeRows`).

    Rows are left-padded to a common width; ``next_tokens`` holds each row's chosen token that
    has not been fed to the model yet, ``next_pos`` the position it will take.
    """

    requests: list[_Request]
    cache: DynamicCache
    attention: torch.Tensor
    next_pos: torch.Tensor
    rows: DecodeRows
    next_tokens: torch.Tensor | None = None
    #: rows that need the host every step (see ``_Request.host_work``)
    host_rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._index_host_rows()

    def _index_host_rows(self) -> None:
        self.host_rows = [row for row, r in enumerate(self.requests) if r.host_work]

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows``; trim cache columns that no remaining row attends to."""
        self.requests = [self.requests[r] for r in rows]
        self.rows.select(rows)
        self._index_host_rows()
        if not rows:
            return
        idx = torch.tensor(rows, device=self.attention.device)
        self.cache.batch_select_indices(idx)
        self.attention, self.next_pos = self.attention[idx], self.next_pos[idx]
        if self.next_tokens is not None:
            self.next_tokens = self.next_tokens[idx]
        first = int(self.attention.any(0).nonzero()[0])
        if first > 0:
            self.attention = self.attention[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def merge(self, other: "_Running") -> "_Running":
        """Join another batch: left-pad the narrower one's cache and mask, stack the rows."""
        width = max(self.attention.shape[1], other.attention.shape[1])

        def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)], dim=0)
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)], dim=0)
        self.attention = torch.cat([pad(self.attention, 1), pad(other.attention, 1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        if self.next_tokens is not None and other.next_tokens is not None:
            self.next_tokens = torch.cat([self.next_tokens, other.next_tokens])
        self.requests += other.requests
        self.rows.extend(other.rows)
        self._index_host_rows()
        return self


#: what one more forward pass costs, in prompt tokens computed (CPU: little; GPU: launches)
_PASS_OVERHEAD_TOKENS = {"cpu": 32, "cuda": 512}


def _pack_by_length(lengths: list[int], overhead: int) -> list[list[int]]:
    """Split rows into forward passes so that padding every row of a pass to its longest costs
    least, a pass costing ``overhead`` tokens more (rows sorted by length, exact split by DP)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j rows (longest first)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 in one pass, padded to the longest, order[i]
            cost = best[i] + overhead + (j - i) * lengths[order[i]]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _shared_start(prompts: list[list[int]]) -> int:
    """Length of the prompts' common prefix, leaving at least one own token to every prompt."""
    return common_prefix_len(prompts, min(len(p) for p in prompts) - 1)
