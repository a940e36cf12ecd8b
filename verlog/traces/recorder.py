"""``TraceRecorder``: writes a server's completions to the trace store off the request path.

The server hands each finished completion to :meth:`TraceRecorder.submit` (a queue put, no I/O);
one background thread writes them in batches, one transaction per batch, and applies the store's
bounds every ``bounds_every_s`` seconds. :meth:`flush` waits until everything submitted so far is
written (feedback does, so that it can name the turns just served).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

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
        write_every_s: the writer wakes at most this often and writes everything queued meanwhile
            in one transaction (waking for every turn would contend with the server's threads for
            the interpreter); :meth:`flush` waits at most this long more.
    """

    def __init__(self, store: TraceStore, *, max_pending: int = 10_000, bounds_every_s: float = 60.0,
                 write_every_s: float = 0.2):
        self.store = store
        self.write_every_s = write_every_s
        self.max_pending = max_pending
        self.bounds_every_s = bounds_every_s
        #: turns written, turns dropped (queue full or a write failed)
        self.written = 0
        self.dropped = 0
        self._queue: queue.Queue[TracedTurn | threading.Event | None] = queue.Queue()
        self._closed = False
        self._next_bounds = time.monotonic()
        self._thread = threading.Thread(target=self._write_loop, name="verlog-trace-recorder", daemon=True)
        self._thread.start()

    def submit(self, turn: TracedTurn) -> None:
        """Queue ``turn`` for writing (never blocks)."""
        if self._closed or self._queue.qsize() >= self.max_pending:
            self.dropped += 1
            return
        self._queue.put(turn)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every turn submitted before this call is written; False on timeout."""
        if self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def close(self) -> None:
        """Write what is queued, then stop the writer (the store stays open: its owner closes it)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[TracedTurn] = []
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
                    self.store.record(batch)
                    self.written += len(batch)
                except Exception:  # a database error loses these turns, never the server
                    log.exception("could not record %d turns in %s", len(batch), self.store.where)
                    self.dropped += len(batch)
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
            time.sleep(self.write_every_s)  # let turns gather: one wake-up and one transaction for them all
