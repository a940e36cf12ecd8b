"""Batches in order, collected ahead of the trainer by at most a bounded staleness.

The trainer trains batch ``k`` (update ``k``) starting from the weights of update ``k - 1``. A
:class:`BatchPipeline` collects the batches one after another on the event loop and lets the
collection of batch ``b`` begin only once the engine holds the weights of update ``b - 1 - s``
(``publish``), ``s`` the bound:

* ``s = 0`` — **alternating** (``trainer.overlap.enabled: false``): batch ``k + 1`` is collected
  once update ``k`` is done (and its checkpoint and evaluation): the rollout and the update take
  turns, every turn is sampled by the weights its update starts from.
* ``s >= 1`` — **overlapped** (``trainer.overlap``): while update ``k`` trains, the slots play
  batch ``k + 1`` (up to ``k + s``) with the weights they have; the new weights reach the engine
  when the update ends. A call admitted into batch ``b`` was admitted under version ``v >= b - 1 -
  s``, so its staleness ``(b - 1) - v``, the updates between the weights that sampled it and those
  its update starts from, is at most ``s``.

Every turn records the version it was admitted under (``Turn.policy_version``); ``live_correction``
turns those into each turn's staleness and its weight in the decoupled PPO loss
(``verlog.algo.off_policy``: the proximal policy is the one the update starts from, the behaviour
policy the one that sampled the turn). A turn can lie beyond the bound only when straggler-tolerant
batches carry it from one batch to a later one: such a turn is left out of the policy loss (weight 0)
and counted (``stale_dropped_turns``); its transition still trains the critic.

The pipeline also measures who waited for whom: the rollout for the trainer (``rollout_wait_s``:
the next batch could not begin before the weights it must follow) and the trainer for the rollout
(``trainer_wait_s``: the batch to train was not collected yet).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Awaitable, Callable

import torch

from verlog.algo.off_policy import OffPolicyCorrection, staleness_weights
from verlog.rollout.slots import SlotBatch

__all__ = ["BatchPipeline", "live_correction"]


class BatchPipeline:
    """Collects batches ``first, first + 1, ...`` with ``collect()`` in a task of its own, batch ``b``
    not before the engine holds update ``b - 1 - max_staleness`` (see the module doc).

    Args:
        collect: the next batch (``SlotRunner.collect`` and what the trainer adds to it).
        first: the number of the first batch, the update that will train it.
        max_staleness: ``s``, 0 for alternating updates.
    """

    def __init__(self, collect: Callable[[], Awaitable[SlotBatch]], *, first: int, max_staleness: int = 0):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self._collect = collect
        self.max_staleness = max_staleness
        #: the update whose weights the engine holds (the first batch follows the one before it)
        self.published = first - 1
        self._next = first
        self._ready: deque[SlotBatch] = deque()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._rollout_wait = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Begin collecting (on the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._produce())

    async def _produce(self) -> None:
        try:
            while True:
                if self.at_bound:
                    waited = time.perf_counter()
                    while self.at_bound:
                        self._changed.clear()
                        await self._changed.wait()
                    self._rollout_wait += time.perf_counter() - waited
                batch = await self._collect()
                self._ready.append(batch)
                self._next += 1
                self._changed.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the rollout cannot go on: the trainer raises it
            self._error = exc
            self._changed.set()

    async def next(self) -> tuple[SlotBatch, dict[str, float]]:
        """The next batch in order, and the waits since the last one: ``trainer_wait_s`` (the
        trainer waited for it) and ``rollout_wait_s`` (the rollout waited for the trainer's weights).
        Raises the rollout's error if it stopped."""
        self.start()
        waited = time.perf_counter()
        while not self._ready:
            if self._error is not None:
                raise self._error
            self._changed.clear()
            await self._changed.wait()
        trainer_wait = time.perf_counter() - waited
        rollout_wait, self._rollout_wait = self._rollout_wait, 0.0
        return self._ready.popleft(), {"trainer_wait_s": trainer_wait, "rollout_wait_s": rollout_wait}

    @property
    def at_bound(self) -> bool:
        """True when the rollout has collected every batch it may before the next ``publish`` (it
        waits for the trainer's weights, or will as soon as its current batch is cut)."""
        return self._next > self.published + self.max_staleness + 1

    def publish(self, update: int) -> None:
        """The engine now holds the weights of ``update``: the batches that may follow them can begin."""
        self.published = max(self.published, update)
        self._changed.set()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def live_correction(
    batch: SlotBatch, update: int, correction: OffPolicyCorrection
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each turn's staleness weight for update ``update`` (which starts from the weights of
    ``update - 1``), slot-major ``[B]``: ``1`` within ``correction.max_versions`` updates, ``0``
    beyond; and the batch's staleness figures. A turn whose version is unknown counts as fresh."""
    start = update - 1
    turns = batch.flat_turns()
    lags = torch.as_tensor(
        [float(start - t.policy_version) if t.policy_version is not None else 0.0 for t in turns],
        dtype=torch.float32,
    )
    weights = staleness_weights(lags, correction.max_versions, correction.decay)
    return weights, {
        "staleness_mean": lags.mean().item() if len(turns) else 0.0,
        "staleness_max": lags.max().item() if len(turns) else 0.0,
        "off_policy_turns": (lags > 0).float().mean().item() if len(turns) else 0.0,
        "stale_dropped_turns": float((weights == 0).sum().item()),
    }
