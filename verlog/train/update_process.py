"""Overlapped updates in a process of their own, for a learner on the CPU.

In one Python process the rollout (the graphs, the batch gate, the engine's decode loop) and an
update on another thread take turns at the interpreter's lock: a small model's update is mostly
short tensor ops, each taking the lock back, so the two hardly overlap (a process running both keeps
about one core busy). :class:`UpdateProcess` runs the updates in a child process instead, with its
own interpreter, on the learner's own tensors:

* the models' parameters (actor, critic, reference) are moved to shared memory before the child
  starts, so the child's optimizer steps change the very tensors the trainer reads afterwards (to
  publish them to the engine, to checkpoint them); nothing is copied back;
* the optimizers live in the children from then on (their state is sent back only for a
  checkpoint: :meth:`optimizer_states`); each update's epochs start from the trainer's mini-batch
  generator's state, which comes back advanced;
* a batch goes to a child as its ``RolloutStorage`` (tensors through shared memory);
* with a critic, the actor's and the critic's PPO epochs run at once in two children: the first
  scores the batch (old logprobs, values, advantages), then each trains its model on the same
  mini-batches (the same generator state: the steps they would take one after the other in one
  process). On the Crafter recipe the epochs are about nine tenths of an update, half of them the
  critic's.

The children start (``spawn``) at the first update, after the critic's pre-training and any resume
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
from verlog.weights.shared_memory import share_models

__all__ = ["UpdateProcess"]


class UpdateProcess:
    """Child processes that run ``score_batch`` and ``ppo_update`` on ``learner`` (see the module doc).

    Args:
        learner: the learner; its models are moved to shared memory here.
        shuffle: the trainer's mini-batch generator (each update's epochs start from its state,
            which they advance as they would here).
        threads: torch's CPU threads in each child.
    """

    def __init__(self, learner: Learner, shuffle: torch.Generator, threads: int):
        if learner.device.type != "cpu":
            raise ValueError(
                f"updates run in a process of their own only on the CPU (the learner is on {learner.device})"
            )
        share_models(learner.actor, learner.critic, learner.reference, purpose="trainer.overlap.update_in: process")
        self.learner, self.shuffle = learner, shuffle
        context = mp.get_context("spawn")
        self._actor = _Child(context, learner, threads, "verlog-update")
        self._critic = _Child(context, learner, threads, "verlog-critic-update") if learner.critic is not None else None

    async def update(self, storage: RolloutStorage, correction: OffPolicyCorrection | None) -> dict[str, float]:
        """Score ``storage`` and run the PPO epochs in the children; the learner's parameters have
        the new weights when this returns."""
        if self._critic is None:
            metrics, shuffle_state = await self._actor.call("update", (storage, correction, self.shuffle.get_state()))
        else:
            metrics, storage = await self._actor.call("score", (storage, correction))
            state = self.shuffle.get_state()
            (actor, shuffle_state), (critic, _) = await asyncio.gather(
                self._actor.call("epochs", (storage, state, "actor")),
                self._critic.call("epochs", (storage, state, "critic")),
            )
            metrics |= actor | critic
        self.shuffle.set_state(shuffle_state)
        return metrics

    async def optimizer_states(self) -> None:
        """Bring the children's optimizer states into the learner's optimizers here (before a checkpoint)."""
        states = await self._actor.call("optimizers")
        if self._critic is not None:
            states["critic"] = (await self._critic.call("optimizers"))["critic"]
        self.learner.actor_optimizer.load_state_dict(states["actor"])
        if self.learner.critic_optimizer is not None and states["critic"] is not None:
            self.learner.critic_optimizer.load_state_dict(states["critic"])

    def close(self) -> None:
        for child in (self._actor, self._critic):
            if child is not None:
                child.close()


class _Child:
    """One update process: requests in order, one at a time."""

    def __init__(self, context: Any, learner: Learner, threads: int, name: str):
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, learner, threads), name=name, daemon=True)
        self._process.start()
        child.close()
        self._lock = asyncio.Lock()

    async def call(self, kind: str, payload: Any = None) -> Any:
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


def _serve(conn: Connection, learner: Learner, threads: int) -> None:
    """A child: answers requests until told to stop (``None``) or its parent goes."""
    torch.set_num_threads(threads)
    while True:
        try:
            request = conn.recv()
        except (EOFError, ConnectionResetError):  # the trainer is gone
            return
        if request is None:
            return
        kind, payload = request
        try:
            reply = ("ok", _answer(kind, payload, learner))
        except BaseException:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):  # the trainer is gone (killed): so is its update
            return


def _answer(kind: str, payload: Any, learner: Learner) -> Any:
    """What a child answers to one request: a whole update, its scoring, one model's epochs (from
    the shuffling generator's state, returned advanced), or the optimizers' states."""
    if kind == "update":
        storage, correction, shuffle_state = payload
        shuffle = torch.Generator().set_state(shuffle_state)
        metrics = score_batch(storage, learner, off_policy=correction)
        metrics |= ppo_update(storage, learner, generator=shuffle)
        return metrics, shuffle.get_state()
    if kind == "score":
        storage, correction = payload
        return score_batch(storage, learner, off_policy=correction), storage
    if kind == "epochs":
        storage, shuffle_state, model = payload
        shuffle = torch.Generator().set_state(shuffle_state)
        metrics = ppo_update(
            storage, learner, update_actor=model == "actor", update_critic=model == "critic", generator=shuffle
        )
        return metrics, shuffle.get_state()
    if kind == "optimizers":
        critic = learner.critic_optimizer.state_dict() if learner.critic_optimizer is not None else None
        return {"actor": learner.actor_optimizer.state_dict(), "critic": critic}
    raise ValueError(f"unknown request {kind!r}")
