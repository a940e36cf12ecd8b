"""Recorded production episodes as fixed-turn batches: the embedded trainer's trace source.

``TraceSource`` reads the episodes of a trace store that have feedback (``data.traces``) and lays
their turns out as a :class:`TraceBatch`, the same ``num_slots x turns_per_env`` shape live
rollouts have: the episodes' turns, in a shuffled order of episodes, fill the slots one after the
other (an episode may continue in the next slot, as a live episode continues after an update).
So everything downstream — values, dual-discount GAE over each episode's turns, whitening — is
the same code as for live turns:

* each turn's reward is the turn feedback it got; the episode feedback's reward is paid on its
  last turn, which is ``terminated`` (the episode's outcome is known);
* a slot whose last turn does not end its episode is bootstrapped from the prompt of the
  episode's next recorded turn (exactly the state that followed);
* each turn carries its staleness weight (``verlog.algo.off_policy.staleness_weights``) from its
  place in the checkpoint lineage (:func:`lineage_staleness`), under the user's rule. Episodes
  every turn of which is dropped are skipped.

The behaviour logprobs are the recorded ones (``Turn.logprobs``); the trainer recomputes the
proximal policy's and applies the decoupled correction (``verlog.algo.off_policy``).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, NamedTuple

import torch

from verlog.algo.off_policy import OffPolicyCorrection, staleness_weights
from verlog.config import ConfigError, TracesConfig
from verlog.rollout.slots import SlotBatch
from verlog.rollout.turn import Turn
from verlog.step_info import SUCCESS_KEY
from verlog.traces import TracedEpisode, TracedTurn, TraceStore, TraceStoreError, open_store
from verlog.traces.records import checkpoint_update

__all__ = ["TraceBatch", "TraceSource", "correction_of", "lineage_staleness", "merge_batches", "trace_slots"]

#: the feedback ``info`` key that names an episode's task: episodes of one group are compared by
#: group estimators (GRPO, RLOO...); without it each episode is a group of its own
GROUP_KEY = "group"


@dataclass
class TraceBatch(SlotBatch):
    """A fixed-turn batch whose turns carry a weight each (``[num_envs][turns_per_env]``): the
    staleness weight of recorded turns (0: dropped), 1 for live ones."""

    turn_weights: list[list[float]] = field(default_factory=list)
    #: the recorded turns' model versions (``None`` for live turns)
    versions: list[list[str | None]] = field(default_factory=list)
    #: recorded episodes read into this batch, and how many turns were recorded ones
    trace_episodes: int = 0
    trace_turns: int = 0


def trace_slots(settings: TracesConfig, num_envs: int, group_size: int = 1) -> int:
    """How many of a batch's ``num_envs`` slots hold recorded turns: ``fraction`` of them, at least
    one, rounded so that the live slots left are whole groups of ``group_size``."""
    live = num_envs - max(1, round(settings.fraction * num_envs))
    return num_envs - live // group_size * group_size


def lineage_staleness(versions: Iterable[str], trained: tuple[str, int] | None = None) -> dict[str, float]:
    """How stale each served version is for the weights being trained: the run's updates between
    them, by the checkpoint lineage (the run's update order), never by when a version answered.

    ``trained`` is ``(run, update)`` of the weights the trainer holds (the run folder's name and
    its update count); ``None``: the newest checkpoint among ``versions`` (by update number). A
    version ``RUN/update_N`` of that run is ``update - N`` updates behind; one of a later update
    (a branch the trainer left when it was rolled back to an earlier checkpoint) is not an
    ancestor of the trained weights and is ``inf`` (always dropped). Any other version (a model
    folder or spec, another run's checkpoint) is what the run started from: ``update`` behind.

    So a rollback is counted right: after serving v1, v2, then v1 again, v1's turns are 1 update
    behind a trainer holding v2, and 0 behind a trainer rolled back to v1 (v2's are then dropped).
    """
    versions = list(dict.fromkeys(versions))
    if trained is None:
        checkpoints = [c for c in map(checkpoint_update, versions) if c is not None]
        trained = max(checkpoints, key=lambda c: c[1], default=None)
    out: dict[str, float] = {}
    for version in versions:
        at = checkpoint_update(version)
        if trained is None:
            out[version] = 0.0  # no checkpoint anywhere: every version is the starting weights
        elif at is None or at[0] != trained[0]:
            out[version] = float(trained[1])
        else:
            out[version] = float(trained[1] - at[1]) if at[1] <= trained[1] else math.inf
    return out


def correction_of(settings: TracesConfig) -> OffPolicyCorrection:
    """The off-policy correction ``data.traces`` asks for."""
    return OffPolicyCorrection(settings.behaviour_weight_cap, settings.staleness.max_versions, settings.staleness.decay)


class _Queued(NamedTuple):
    """A recorded turn waiting for a batch: its staleness weight, the version that served it, and
    whether it opens its episode (the first of the episode's turns the store returned)."""

    turn: Turn
    weight: float
    version: str
    opens: bool


class TraceSource:
    """Batches of recorded turns from the store ``settings.store`` (see the module doc).

    Episodes are read in epochs: each epoch takes the store's episodes with feedback at that time
    (new traces join at the next epoch) in a shuffled order. ``turns_per_env`` is the slots'
    length, as for live slots.
    """

    def __init__(
        self,
        settings: TracesConfig,
        num_slots: int,
        turns_per_env: int,
        *,
        seed: int = 0,
        store: TraceStore | None = None,
    ):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.settings = settings
        self.num_slots, self.turns_per_env = num_slots, turns_per_env
        self.correction = correction_of(settings)
        try:
            self.store = store or open_store(settings.store, create=False)
        except TraceStoreError as exc:
            raise ConfigError(f"data.traces.store: {exc}") from None
        self._rng = random.Random(seed)
        self._queue: list[_Queued] = []  # turns of the epoch not yet batched
        self.epochs = 0
        #: ``(run, update)`` of the weights being trained, set by the trainer before each batch
        #: (staleness is counted from them: :func:`lineage_staleness`); ``None``: the newest
        #: checkpoint in the store
        self.trained: tuple[str, int] | None = None

    # ------------------------------------------------------------------ reading episodes
    def _episode_turns(self, record: TracedEpisode, staleness: dict[str, float]) -> list[_Queued]:
        traced = self.store.turns(record.episode_id)
        if not traced:
            return []
        lags = torch.as_tensor([staleness.get(t.model_version, math.inf) for t in traced])
        weights = staleness_weights(lags, self.correction.max_versions, self.correction.decay).tolist()
        if not any(weights):
            return []  # every turn too stale: nothing of it is trained
        group = record.info.get(GROUP_KEY, record.episode_id)
        seed = zlib.crc32(str(group).encode()) & 0x7FFFFFFF
        last = len(traced) - 1
        return [
            _Queued(self._turn(t, record, seed, is_last=i == last), w, t.model_version, opens=i == 0)
            for i, (t, w) in enumerate(zip(traced, weights))
        ]

    @staticmethod
    def _turn(t: TracedTurn, record: TracedEpisode, seed: int, *, is_last: bool) -> Turn:
        reward = t.reward + ((record.reward or 0.0) if is_last else 0.0)
        info: dict[str, Any] = {"model_version": t.model_version, "trace_seed": seed}
        if is_last and record.success is not None:
            info[SUCCESS_KEY] = record.success
        # a TracedTurn is a Turn: the batch trains it as stored, less the text it never reads (a batch
        # holds thousands of turns; a recorded Turn keeps messages only when asked to)
        return replace(t, reward=reward, terminated=is_last, info=info, messages=None, response_text=None)

    def _refill(self) -> None:
        """The next epoch's turns, episode after episode in a shuffled order."""
        records = self.store.episodes(with_feedback=True)
        staleness = lineage_staleness(self.store.versions(), self.trained)
        self._rng.shuffle(records)
        for record in records:
            self._queue += self._episode_turns(record, staleness)
        if not self._queue:
            total = len(self.store.episodes())
            raise ConfigError(
                f"data.traces.store: {self.store.where} holds no episode to train on ({total} episodes, none with "
                "feedback and trainable turns): attach rewards with POST /v1/feedback or TraceStore.add_feedback, "
                "or relax data.traces.staleness.max_versions"
            )
        self.epochs += 1

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> TraceBatch:
        """``num_slots x turns_per_env`` recorded turns, weights and bootstrap prompts."""
        need = self.num_slots * self.turns_per_env
        while len(self._queue) < need + 1:  # one more: the prompt after the batch's last turn
            before = len(self._queue)
            self._refill()
            if len(self._queue) == before:
                break
        taken, self._queue = self._queue[:need], self._queue[need:]
        # the weights of the turns taken, from the weights being trained now (an epoch read earlier
        # may have been queued when the trainer held older ones)
        staleness = lineage_staleness(self.store.versions(), self.trained)
        now = staleness_weights(
            torch.as_tensor([staleness.get(q.version, math.inf) for q in taken]),
            self.correction.max_versions,
            self.correction.decay,
        ).tolist()
        taken = [q._replace(weight=w) for q, w in zip(taken, now)]
        k = self.turns_per_env
        turns, weights, versions, boot, starts, seeds = [], [], [], [], [], []
        for i in range(self.num_slots):
            part = taken[i * k : (i + 1) * k]
            turns.append([q.turn for q in part])
            weights.append([q.weight for q in part])
            versions.append([q.version for q in part])
            seeds.append([q.turn.info["trace_seed"] for q in part])
            starts.append(part[0].opens)  # (never read off turn numbers: only the store's order says)
            last = part[-1].turn
            following = (
                taken[(i + 1) * k].turn if (i + 1) * k < len(taken) else (self._queue[0].turn if self._queue else None)
            )
            # a cut episode continues with its next recorded turn; a finished one needs no value
            boot.append(
                list(following.prompt_ids) if following is not None and not last.done else list(last.prompt_ids)
            )
        episodes = {t.episode_id for slot in turns for t in slot}
        return TraceBatch(
            turns=turns,
            bootstrap_prompt_ids=boot,
            starts_episode=starts,
            seeds=seeds,
            turn_weights=weights,
            versions=versions,
            trace_episodes=len(episodes),
            trace_turns=need,
        )

    def close(self) -> None:
        self.store.close()


def merge_batches(live: SlotBatch | None, traces: TraceBatch | None) -> SlotBatch:
    """One batch of live slots and recorded slots side by side (same ``turns_per_env``; live
    slots of whole groups may give fewer). Recorded slots are compared as they are laid out."""
    if live is None or traces is None:
        batch = live if traces is None else traces
        if batch is None:
            raise ValueError("merge_batches needs at least one batch")
        return batch
    ragged = live.compared is not None  # a slot waiting for its group gives fewer turns
    if live.turns_per_env > traces.turns_per_env or (live.turns_per_env < traces.turns_per_env and not ragged):
        raise ValueError(f"live slots give {live.turns_per_env} turns, recorded slots {traces.turns_per_env}")
    return TraceBatch(
        turns=live.turns + traces.turns,
        bootstrap_prompt_ids=live.bootstrap_prompt_ids + traces.bootstrap_prompt_ids,
        bootstrap_images=live.slot_images() + traces.slot_images(),
        starts_episode=live.starts_episode + traces.starts_episode,
        seeds=live.seeds + traces.seeds,
        episodes=live.episodes,
        failed=live.failed,
        seconds=live.seconds,
        turn_weights=[[1.0] * len(slot) for slot in live.turns] + traces.turn_weights,
        versions=[[None] * len(slot) for slot in live.turns] + traces.versions,
        trace_episodes=traces.trace_episodes,
        trace_turns=traces.trace_turns,
        compared=None if not ragged else live.compared + [[True] * len(slot) for slot in traces.turns],
        whole_groups=live.whole_groups,
        groups_dropped=live.groups_dropped,
    )
