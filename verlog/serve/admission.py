"""Admission of chat requests: which may wait, which may generate, where their bodies are
prepared, and how long a prompt may be before it is tokenized in full.

* **Places.** At most ``running`` requests generate at once and ``waiting`` more are admitted
  (being prepared, or waiting for a generation slot); the rest get 429 with ``Retry-After``,
  checked before a body is read (on its ``Content-Length``) and again once it has arrived.
* **Two lanes.** A body is *prepared* (decoded, validated, its prompt rendered and measured) on a
  worker thread: bodies up to ``large_body_bytes`` on the small lane's workers, larger ones on the
  large lane's own worker, where at most ``large_waiting`` may be at once (more large bodies get
  429), one at a time and paced to :data:`LARGE_LANE_SHARE` of a core. A flood of large bodies
  fills its own lane and takes a bounded share of the CPU; small requests keep their workers,
  their places in the queue and the rest of the machine.
* **Prompt length before tokenization.** A prompt's token count is bounded from its rendered
  text before it is tokenized whole (:class:`PromptBound`): a text too long for any tokenization
  to fit is refused from its byte count alone, and a longer text is counted a chunk at a time and
  refused as soon as the count passes the limit. So the work spent on a prompt that is refused
  grows with the limit, not with the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from verlog.backends.token_bytes import TokenBytes
from verlog.serve.openai_protocol import APIError

__all__ = ["Admission", "LARGE_LANE_SHARE", "Lane", "PromptBound", "prompt_too_long"]

#: the share of one core that preparing large bodies may take: the large lane prepares one body
#: at a time and rests after each in proportion (a body that took 4 ms is followed by 12 ms of rest)
LARGE_LANE_SHARE = 0.25


@dataclass
class Lane:
    """Where bodies of one size class are prepared: its worker threads, how many of its requests
    may be admitted at once (``None``: only the server's overall bound), and the share of one
    core its preparing may take (``1.0``: no pacing)."""

    name: str
    workers: int
    places: int | None
    share: float = 1.0
    admitted: int = 0
    pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _turn: asyncio.Lock | None = field(default=None, repr=False)
    _next_start: float = 0.0

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold the lane's turn to prepare one body. A paced lane (``share < 1``) prepares one
        body at a time and rests after each for as long as needed to keep its work within
        ``share`` of a core: a flood of large bodies cannot take the CPU the others need."""
        if self.share >= 1.0:
            yield
            return
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            await asyncio.sleep(max(0.0, self._next_start - time.monotonic()))
            started = time.monotonic()
            try:
                yield
            finally:
                took = time.monotonic() - started
                self._next_start = time.monotonic() + took * (1.0 / self.share - 1.0)

    def start(self) -> None:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"verlog-openai-{self.name}")

    def stop(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.shutdown(wait=False, cancel_futures=True)


class Admission:
    """Places, lanes and generation slots of one server (see the module doc).

    Args:
        running: requests generating at once.
        waiting: requests admitted beyond those (being prepared or waiting for a slot).
        large_body_bytes: bodies larger than this are prepared on the large lane.
        large_waiting: large bodies admitted at once (each holds its place until answered).
        large_share: the share of one core the large lane's preparing may take (paced).
    """

    def __init__(
        self,
        running: int,
        waiting: int,
        *,
        large_body_bytes: int,
        large_waiting: int,
        large_share: float = LARGE_LANE_SHARE,
    ):
        self.running, self.waiting = running, waiting
        self.large_body_bytes = large_body_bytes
        self.small = Lane("prepare", workers=2, places=None)
        self.large = Lane("prepare-large", workers=1, places=large_waiting, share=large_share)
        #: requests admitted (waiting or generating) and, of those, generating
        self.admitted = 0
        self.active = 0
        self._semaphore: asyncio.Semaphore | None = None
        self._typical_s: float | None = None

    def start(self) -> None:
        self.small.start()
        self.large.start()

    def stop(self) -> None:
        self.small.stop()
        self.large.stop()

    @property
    def queued(self) -> int:
        """Admitted requests not generating yet (being prepared, or waiting for a slot)."""
        return self.admitted - self.active

    def lane(self, body_bytes: int | None) -> Lane:
        """The lane of a body of ``body_bytes`` (unknown before a chunked body is read: small)."""
        return self.large if body_bytes is not None and body_bytes > self.large_body_bytes else self.small

    def retry_after_s(self) -> int:
        """About when a slot frees up: the typical time a generation takes here (a smoothed
        average, 1 s before any has finished; between 1 and 60 s)."""
        return min(60, max(1, math.ceil(self._typical_s or 1.0)))

    def check(self, lane: Lane) -> None:
        """429 (with ``Retry-After``) if there is no room for one more request on ``lane``."""
        full = self.admitted >= self.running + self.waiting
        if full or (lane.places is not None and lane.admitted >= lane.places):
            retry = self.retry_after_s()
            what = (
                f"{self.active} requests generating, {self.queued} waiting"
                if full
                else f"{lane.admitted} large request bodies are being handled; smaller ones are still served"
            )
            raise APIError(
                429,
                f"the server is busy ({what}); retry in {retry} s",
                type="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": str(retry)},
            )

    @contextlib.asynccontextmanager
    async def admit(self, lane: Lane) -> AsyncIterator[None]:
        """Count a request as admitted on ``lane`` until it is done; 429 if there is no room."""
        self.check(lane)
        self.admitted += 1
        lane.admitted += 1
        try:
            yield
        finally:
            self.admitted -= 1
            lane.admitted -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Inside :meth:`admit`: wait for a generation slot and hold it."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.running)
        await self._semaphore.acquire()
        self.active += 1
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            self._typical_s = took if self._typical_s is None else 0.8 * self._typical_s + 0.2 * took
            self.active -= 1
            self._semaphore.release()


#: the names in a tokenizer normalizer's repr (``Sequence(normalizers=[NFC(), Lowercase()])``)
_NORMALIZER_KIND = re.compile(r"\b([A-Z][A-Za-z]*)\(")
#: normalizers that shorten a text at most 3x (Unicode normal forms compose up to 3 code points
#: into one) or not at all; any other (accent stripping, replacements) may delete text
_SHORTENING_AT_MOST_3X = frozenset({"Sequence", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend"})


class PromptBound:
    """Refuses a rendered prompt longer than ``limit`` tokens without tokenizing all of it.

    No token of the tokenizer stands for more than :attr:`max_token_bytes` bytes of text (its
    longest token; four times that when the tokenizer puts its input in a Unicode normal form,
    which may shorten it up to 3x; no bound when its normalizer may delete text), so a text of
    ``n`` bytes is at least ``n / max_token_bytes`` tokens: past ``limit`` it is refused unread. Otherwise a text longer than :data:`CHUNK_CHARS` is counted
    chunk by chunk, each cut at a space, and refused once the count (less 2 per cut: a cut may
    split or join a token at each side) passes ``limit``. A prompt within the limit is then
    tokenized whole, and its exact length checked, by the caller.
    """

    #: the text tokenized at a time when counting a long prompt
    CHUNK_CHARS = 16_384

    def __init__(self, tokenizer: Any, limit: int):
        self.tokenizer, self.limit = tokenizer, limit
        self._max_token_bytes: int | None = None

    @property
    def max_token_bytes(self) -> int | None:
        """The most bytes of input one token may stand for (computed once); ``None`` when the
        tokenizer's normalizer may delete text (no bound from bytes then)."""
        if self._max_token_bytes is None:
            token_bytes = TokenBytes(self.tokenizer)
            longest = max(1, max((len(b) for b in token_bytes.vocabulary(len(self.tokenizer))), default=1))
            normalizer = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "normalizer", None)
            kinds = set(_NORMALIZER_KIND.findall(repr(normalizer))) if normalizer is not None else set()
            if not kinds:
                self._max_token_bytes = longest
            elif kinds <= _SHORTENING_AT_MOST_3X:
                self._max_token_bytes = 4 * longest
            else:
                self._max_token_bytes = 0
        return self._max_token_bytes or None

    def _refuse(self, what: str) -> APIError:
        return prompt_too_long(what, self.limit)

    def check(self, text: str) -> None:
        """Raise :class:`APIError` (400 ``context_length_exceeded``) if ``text`` is surely longer
        than the limit."""
        if len(text) <= self.CHUNK_CHARS:
            return  # cheap to tokenize whole: the caller's exact check decides
        n_bytes = len(text.encode("utf-8", errors="surrogatepass"))
        per_token = self.max_token_bytes
        if per_token is not None and n_bytes // per_token > self.limit:
            raise self._refuse(f"{n_bytes} bytes long: at least {n_bytes // per_token} tokens")
        counted, cuts, start = 0, 0, 0
        while start < len(text):
            end = min(len(text), start + self.CHUNK_CHARS)
            if end < len(text):
                space = text.rfind(" ", start + self.CHUNK_CHARS // 2, end)
                end = space if space > start else end
                cuts += 1
            counted += len(self.tokenizer(text[start:end], add_special_tokens=False)["input_ids"])
            if counted - 2 * cuts > self.limit:
                raise self._refuse(f"more than {counted - 2 * cuts} tokens long (counted until it passed the limit)")
            start = end


def prompt_too_long(what: str, limit: int) -> APIError:
    """The 400 ``context_length_exceeded`` for a prompt that is ``what`` (e.g. "812 tokens long")
    where the server accepts at most ``limit`` tokens."""
    return APIError(
        400,
        f"the prompt is {what}; this server accepts at most {limit}",
        param="messages",
        code="context_length_exceeded",
    )
