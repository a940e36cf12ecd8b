"""Overlapped updates in a process of their own, for a learner on the CPU.

In one Python process the rollout (the graphs, the batch gate, the engine's decode loop) and an
update on another thread take turns at the interpreter's lock: a small model's update is mostly
short tensor ops, each taking the lock back, so the two hardly overlap (a process running both keeps
about one core busy). :class:`UpdateProcess` runs the updates in a child process instead, with its
own interpreter, on the learner's own tensors:

* the models' parameters (actor, critic, reference) are moved to shared memory before the child
  starts, so the child's optimizer steps change the very tensors the trainer reads afterwards (to
  publish them to the engine, to checkpoint them); nothing is copied back;
* the optimizers live in the child from then on (their state is sent back only for a checkpoint:
  :meth:`optimizer_states`), as does the mini-batch shuffling generator (its state comes back with
  each update's metrics, for checkpoints);
* a batch goes to the child as its ``RolloutStorage`` (tensors through shared memory).

The child starts (``spawn``) at the first update, after the critic's pre-training and any resume
changed the learner in this process. CPU only: CUDA tensors are not shared this way.
"""

from __future__ import annotations

import asyncio
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing as mp

from verlog.algo.off_policy import OffPolicyCorrection
from verlog.train.ppo import Learner, ppo_update, score_batch
from verlog.train.storage import RolloutStorage

__all__ = ["UpdateProcess"]


class UpdateProcess:
    """A child process that runs ``score_batch`` and ``ppo_update`` on ``learner`` (see the module doc).

    Args:
        learner: the learner; its models are moved to shared memory here.
        shuffle: the trainer's mini-batch generator (its state moves to the child and back).
        threads: torch's CPU threads in the child.
    """

    def __init__(self, learner: Learner, shuffle: torch.Generator, threads: int):
        if learner.device.type != "cpu":
            raise ValueError(
                f"updates run in a process of their own only on the CPU (the learner is on {learner.device})"
            )
        for model in (learner.actor, learner.critic, learner.reference):
            if model is not None:
                model.share_memory()
        self.learner, self.shuffle = learner, shuffle
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, learner, shuffle.get_state(), threads), name="verlog-update", daemon=True
        )
        self._process.start()
        child.close()
        self._lock = asyncio.Lock()

    async def _call(self, kind: str, payload: Any = None) -> Any:
        async with self._lock:  # one request at a time
            self._conn.send((kind, payload))
            try:
                status, result = await asyncio.get_running_loop().run_in_executor(None, self._conn.recv)
            except (EOFError, ConnectionResetError):
                self._process.join(timeout=10)
                raise RuntimeError(
                    f"the update process stopped (exit code {self._process.exitcode}). It starts by importing the "
                    "script that runs the training: a script calling verlog.train.train() must call it under "
                    '`if __name__ == "__main__":`; else it ran out of memory or was killed. '
                    "trainer.overlap.update_in: thread runs the updates in this process instead"
                ) from None
        if status == "error":
            raise RuntimeError(f"the update failed in the update process:\n{result}")
        return result

    async def update(self, storage: RolloutStorage, correction: OffPolicyCorrection | None) -> dict[str, float]:
        """Score ``storage`` and run the PPO epochs in the child; the learner's parameters have the
        new weights when this returns."""
        metrics, shuffle_state = await self._call("update", (storage, correction))
        self.shuffle.set_state(shuffle_state)
        return metrics

    async def optimizer_states(self) -> None:
        """Bring the child's optimizer states into the learner's optimizers here (before a checkpoint)."""
        states = await self._call("optimizers")
        self.learner.actor_optimizer.load_state_dict(states["actor"])
        if self.learner.critic_optimizer is not None and states["critic"] is not None:
            self.learner.critic_optimizer.load_state_dict(states["critic"])

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
        self._conn.close()


def _serve(conn: Connection, learner: Learner, shuffle_state: torch.Tensor, threads: int) -> None:
    """The child: updates on request until told to stop (``None``) or its parent goes."""
    torch.set_num_threads(threads)
    shuffle = torch.Generator().set_state(shuffle_state)
    while True:
        try:
            request = conn.recv()
        except (EOFError, ConnectionResetError):  # the trainer is gone
            return
        if request is None:
            return
        kind, payload = request
        try:
            reply = ("ok", _answer(kind, payload, learner, shuffle))
        except BaseException:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):  # the trainer is gone (killed): so is its update
            return


def _answer(kind: str, payload: Any, learner: Learner, shuffle: torch.Generator) -> Any:
    """What the child answers to one request."""
    if kind == "update":
        storage, correction = payload
        metrics = score_batch(storage, learner, off_policy=correction)
        metrics |= ppo_update(storage, learner, generator=shuffle)
        return metrics, shuffle.get_state()
    if kind == "optimizers":
        critic = learner.critic_optimizer.state_dict() if learner.critic_optimizer is not None else None
        return {"actor": learner.actor_optimizer.state_dict(), "critic": critic}
    raise ValueError(f"unknown request {kind!r}")
