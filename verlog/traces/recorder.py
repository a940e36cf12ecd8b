"""``TraceRecorder``: writes a server's completions to the trace store off the event loop, and
says when each is durable.

The server hands each finished completion to :meth:`TraceRecorder.submit` (a queue put, no I/O)
and gets a future that is done once the turn is committed; it sends its answer after that, so no
completion is acknowledged before its turn is in the store (a ``kill -9`` right after a 200 loses
nothing the client was told about). One background thread writes whatever has gathered while it
wrote the last batch in one transaction (group commit: under load one commit covers many turns,
idle it covers one), and applies the store's bounds every ``bounds_every_s`` seconds.

``write_behind_s`` (off by default) trades that guarantee for fewer commits: the writer then
sleeps that long between batches and answers are not held for it, so a crash loses up to that
window of acknowledged turns; closing the recorder (``serve-model`` does on SIGTERM and Ctrl-C)
writes what is queued first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from verlog.traces.records import TracedTurn
from verlog.traces.store import TraceStore

__all__ = ["TraceRecorder"]

log = logging.getLogger(__name__)


class TraceRecorder:
    """A background writer of :class:`TracedTurn` records into ``store``.

    Args:
        store: where the turns go (its :class:`RecordingPolicy` decides what is kept).
        max_pending: turns waiting to be written beyond which new ones are dropped (and counted
            in :attr:`dropped`): a stuck database must not grow the server's memory without bound.
        bounds_every_s: how often the store's retention and size bounds are applied.
        write_behind_s: ``0`` (default): every turn is committed before its answer is sent
            (:attr:`durable`). ``> 0``: answers are not held; the writer commits at most this
            often, and a crash may lose the turns of the last window.
        wait_s: the longest an answer waits for its turn's commit: past it (a database that
            hangs) the answer goes out and the turn is counted in :attr:`late` (it is still
            written when the database answers, or counted in :attr:`dropped`).
    """

    def __init__(
        self,
        store: TraceStore,
        *,
        max_pending: int = 10_000,
        bounds_every_s: float = 60.0,
        write_behind_s: float = 0.0,
        wait_s: float = 30.0,
    ):
        if write_behind_s < 0:
            raise ValueError(
                f"write_behind_s must be >= 0 (0: every turn durable before its answer), got {write_behind_s}"
            )
        self.store = store
        self.write_behind_s = write_behind_s
        self.max_pending = max_pending
        self.bounds_every_s = bounds_every_s
        self.wait_s = wait_s
        #: turns written, turns dropped (queue full or a write failed), answers sent before
        #: their turn was committed (the commit took longer than ``wait_s``)
        self.written = 0
        self.dropped = 0
        self.late = 0
        self._queue: queue.Queue[tuple[TracedTurn, Future] | threading.Event | None] = queue.Queue()
        self._closed = False
        self._wake = threading.Event()  # ends a write-behind wait early: close and flush
        self._next_bounds = time.monotonic()
        self._thread = threading.Thread(target=self._write_loop, name="verlog-trace-recorder", daemon=True)
        self._thread.start()

    @property
    def durable(self) -> bool:
        """Whether answers wait for their turn to be committed (no write-behind window)."""
        return self.write_behind_s == 0

    def submit(self, turn: TracedTurn) -> Future | None:
        """Queue ``turn`` for writing (never blocks). Returns a future that is done when the turn
        is committed (result ``True``) or its write failed (``False``); ``None`` when the turn was
        dropped at once (the queue is full, or the recorder closed)."""
        if self._closed or self._queue.qsize() >= self.max_pending:
            self.dropped += 1
            return None
        done: Future = Future()
        self._queue.put((turn, done))
        return done

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every turn submitted before this call is written; False on timeout."""
        if self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)
        self._wake.set()
        return done.wait(timeout_s)

    def close(self) -> None:
        """Write what is queued, then stop the writer (the store stays open: its owner closes it)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._wake.set()
            self._thread.join(timeout=60)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[tuple[TracedTurn, Future]] = []
            events: list[threading.Event] = []
            stop = False
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    events.append(item)
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                try:
                    self.store.record([turn for turn, _ in batch])
                    self.written += len(batch)
                    ok = True
                except Exception:  # a database error loses these turns, never the server
                    log.exception("could not record %d turns in %s", len(batch), self.store.where)
                    self.dropped += len(batch)
                    ok = False
                for _, done in batch:
                    done.set_result(ok)
            if time.monotonic() >= self._next_bounds:
                self._next_bounds = time.monotonic() + self.bounds_every_s
                try:
                    self.store.enforce_bounds()
                except Exception:
                    log.exception("could not apply the bounds of %s", self.store.where)
            for event in events:
                event.set()
            if stop:
                return
            if self.write_behind_s:  # let turns gather: one wake-up and one transaction for them all
                self._wake.wait(self.write_behind_s)
                self._wake.clear()
