"""``RolloutStorage``: one fixed-turn batch as tensors, and its advantages and returns.

Rows are turns, slot-major (row ``i * K + k`` is turn ``k`` of slot ``i``), so ``view(N, K, ...)``
gives the ``TurnBatch`` layout of ``verlog.algo``. Responses are right-padded to ``T`` tokens;
value positions ``j = 0..L`` to ``T + 1``.

**Whole groups.** A batch of whole groups (``SlotBatch.compared``, group estimators) has slots of
different lengths, and only some plays may be compared. The estimator then sees an ``[N, K]``
grid holding, in each slot's row, only its compared turns in order (``grid``: the cell of each
turn, ``-1`` for the others), padded with empty cells (no response token, no reward, not done,
group and anchor ``-1``: a trailing episode that never ends, so no estimator scores it). Turns
left out of the grid get advantage ``0`` and no place in the policy loss: a group that was not
played whole in the batch is never compared, not even in part. The advantages come from the configured estimator of
``verlog.algo.estimators`` (the storage holds data; the registry holds the maths).

**Stragglers.** With straggler-tolerant batches a slot gives between 0 and its cap of turns; each
slot's turns then fill the *end* of its grid row (``aligned_grid``), empty cells before them, so the
value bootstrapping its last turn follows it as in a full row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Sequence

import torch
from torch import Tensor

from verlog.algo import TurnBatch
from verlog.algo.estimators import Estimate, TurnData, estimate_advantages
from verlog.backends.base import Constraint
from verlog.config import AlgorithmConfig
from verlog.rollout.slots import SlotBatch
from verlog.step_info import ANCHOR_KEY  # re-exported: the GiGPO anchor key's home is verlog.step_info

__all__ = ["ANCHOR_KEY", "RolloutStorage", "aligned_grid", "anchor_ids", "compared_grid"]


def compared_grid(compared: Sequence[Sequence[bool]], turns_per_env: int) -> Tensor:
    """The grid cell of each turn (slot-major), ``[B]`` long: slot ``i``'s compared turns fill
    cells ``i * K, i * K + 1, ...`` in order; the others are ``-1``."""
    cells = []
    for i, flags in enumerate(compared):
        k = 0
        for flag in flags:
            cells.append(i * turns_per_env + k if flag else -1)
            k += bool(flag)
    return torch.as_tensor(cells, dtype=torch.long)


def aligned_grid(lengths: Sequence[int], turns_per_env: int) -> Tensor:
    """The grid cell of each turn (slot-major), ``[B]`` long, when slots gave different numbers of
    turns (straggler-tolerant batches): slot ``i``'s ``n_i`` turns fill the last ``n_i`` cells of its
    row, ``i * K + K - n_i ...``, so its last turn is the row's last cell, the one the slot's
    bootstrap value follows; the empty cells before them hold no tokens."""
    cells = [i * turns_per_env + turns_per_env - n + k for i, n in enumerate(lengths) for k in range(n)]
    return torch.as_tensor(cells, dtype=torch.long)


def anchor_ids(infos: Sequence[dict]) -> Tensor:
    """One id per distinct ``info["anchor"]`` of the batch, ``[B]`` long; ``-1`` where none."""
    ids: dict = {}
    out = []
    for info in infos:
        anchor = info.get(ANCHOR_KEY) if info else None
        if anchor is None:
            out.append(-1)
            continue
        key = anchor if isinstance(anchor, (str, int, float, bool)) else repr(anchor)
        out.append(ids.setdefault(key, len(ids)))
    return torch.as_tensor(out, dtype=torch.long)


@dataclass
class RolloutStorage:
    """A batch of turns and everything computed for it before the PPO epochs."""

    num_envs: int
    turns_per_env: int
    #: ``prompt_ids + response_ids`` of each turn
    sequences: list[list[int]]
    prompt_lengths: Tensor  # [B] long
    response_ids: Tensor  # [B, T] long
    response_mask: Tensor  # [B, T] bool
    rollout_logprobs: Tensor  # [B, T] the engine's logprobs
    #: [B] the temperature each turn was sampled at (greedy turns: 1): every logprob, ratio,
    #: KL and entropy of a turn is recomputed at its own temperature
    temperatures: Tensor
    rewards: Tensor  # [B] the environment's reward of each turn
    terminated: Tensor  # [B] bool
    truncated: Tensor  # [B] bool
    seeds: Tensor  # [B] long, the seed of each turn's episode
    anchors: Tensor  # [B] long, the id of the state each turn acted in (``info["anchor"]``), -1: none
    #: the prompt held at the boundary in each slot (``[N]`` lists of ids)
    bootstrap_prompts: list[list[int]]
    starts_episode: Tensor  # [N] bool (whole groups: of each grid row)
    #: per turn, the prompt of the state after a truncation (``None``: not truncated, or unknown)
    truncation_prompts: list[list[int] | None]
    # computed before the update
    old_logprobs: Tensor | None = None  # [B, T]
    values: Tensor | None = None  # [B, T + 1]
    bootstrap_values: Tensor | None = None  # [N]
    truncation_values: Tensor | None = None  # [B], NaN where no truncation prompt is known
    token_rewards: Tensor | None = None  # [B, T]
    advantages: Tensor | None = None  # [B, T]
    returns: Tensor | None = None  # [B, T + 1]
    #: the tokens the policy loss uses (``response_mask`` less the turns the estimator leaves out)
    policy_mask: Tensor | None = None  # [B, T]
    #: [B] each turn's weight in the policy loss: recorded turns' staleness weight (0: dropped), live
    #: turns' 1 (0 beyond the staleness bound of overlapped updates); ``None``: no off-policy correction
    turn_weights: Tensor | None = None
    #: [B] long, slots of different lengths only (whole groups, stragglers): the cell ``i * K + k`` of the
    #: estimators' grid each turn takes, ``-1``: not compared (see the module doc); ``None``: row
    #: ``i * K + k`` is cell ``i * K + k``
    grid: Tensor | None = None
    #: each turn's output ``[len, H]`` of the frozen trunk the actor and critic share
    #: (``Learner.trunk_depth``; computed once per batch by ``score_batch``), ``None``: not computed
    trunk_states: list[Tensor] | None = None
    #: per turn, the images of its prompt (``Turn.images``: base64 files; a vision-language
    #: model's turns), and of each slot's held prompt; empty lists: a batch without images
    images: list[tuple[str, ...]] = field(default_factory=list)
    bootstrap_images: list[tuple[str, ...]] = field(default_factory=list)
    #: per turn, the constraint its response was sampled under (``Turn.constraint`` and
    #: ``Turn.grammar``; ``None``: unconstrained or its grammar unknown); empty: none constrained
    constraints: list[Constraint | None] = field(default_factory=list)
    #: how many turns were sampled under a constraint whose grammar they do not record
    unknown_grammars: int = 0
    #: the packed token masks of the constrained rows (``verlog.train.grammar_masks``), by row;
    #: ``None``: not built (``algorithm.constrained_logprobs: policy``, or no constrained row)
    token_masks: dict[int, Tensor] | None = None

    @classmethod
    def from_batch(cls, batch: SlotBatch) -> "RolloutStorage":
        turns = batch.flat_turns()
        width = max(len(t.response_ids) for t in turns)
        response_ids = torch.zeros(len(turns), width, dtype=torch.long)
        logprobs = torch.zeros(len(turns), width)
        for row, turn in enumerate(turns):
            n = len(turn.response_ids)
            response_ids[row, :n] = torch.as_tensor(turn.response_ids)
            logprobs[row, :n] = torch.as_tensor(turn.logprobs)
        lengths = torch.as_tensor([len(t.response_ids) for t in turns])
        rewards = torch.as_tensor([t.reward for t in turns], dtype=torch.float32)
        storage = cls(
            num_envs=batch.num_envs,
            turns_per_env=batch.turns_per_env,
            sequences=[list(t.prompt_ids) + list(t.response_ids) for t in turns],
            prompt_lengths=torch.as_tensor([len(t.prompt_ids) for t in turns]),
            response_ids=response_ids,
            response_mask=torch.arange(width) < lengths.unsqueeze(1),
            rollout_logprobs=logprobs,
            temperatures=torch.as_tensor([t.scoring_temperature for t in turns], dtype=torch.float32),
            rewards=rewards,
            terminated=torch.as_tensor([t.terminated for t in turns]),
            truncated=torch.as_tensor([t.truncated and not t.terminated for t in turns]),
            seeds=torch.as_tensor([s for slot in batch.seeds for s in slot]),
            anchors=anchor_ids([t.info for t in turns]),
            bootstrap_prompts=[list(p) for p in batch.bootstrap_prompt_ids],
            starts_episode=torch.as_tensor(batch.starts_episode),
            truncation_prompts=[
                list(t.next_prompt_ids) if t.truncated and not t.terminated and t.next_prompt_ids else None
                for t in turns
            ],
        )
        weights = getattr(batch, "turn_weights", None)  # a TraceBatch (verlog.train.trace_batches)
        if weights:
            storage.turn_weights = torch.as_tensor([w for slot in weights for w in slot], dtype=torch.float32)
        if batch.compared is not None:
            storage.grid = compared_grid(batch.compared, batch.turns_per_env)
            # a grid row opens with its slot's first turn when that is compared, else with a
            # compared play's first turn (a whole group's plays begin in the batch)
            storage.starts_episode = torch.as_tensor(
                [start if flags and flags[0] else True for start, flags in zip(batch.starts_episode, batch.compared)]
            )
        elif batch.ragged:  # stragglers: each slot's turns end its grid row (its bootstrap follows them)
            storage.grid = aligned_grid([len(slot) for slot in batch.turns], batch.turns_per_env)
        if any(t.images for t in turns):
            storage.images = [tuple(t.images) for t in turns]
        if any(batch.bootstrap_images):
            storage.bootstrap_images = [tuple(x) for x in batch.bootstrap_images]
        if any(t.constraint for t in turns):
            storage.constraints = [
                Constraint(t.constraint, t.grammar) if t.constraint and t.grammar else None for t in turns
            ]  # type: ignore[arg-type]
            storage.unknown_grammars = sum(1 for t in turns if t.constraint and not t.grammar)
        storage.token_rewards = storage.env_token_rewards()
        return storage

    def row_images(self, row: int) -> tuple[str, ...]:
        """The images of turn ``row``'s prompt (``()``: none)."""
        return self.images[row] if self.images else ()

    # ------------------------------------------------------------------ shapes
    @property
    def size(self) -> int:
        return len(self.sequences)

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(1)

    @property
    def value_mask(self) -> Tensor:
        """``[B, T + 1]``: the value positions ``j = 0..L`` of each turn."""
        j = torch.arange(self.response_mask.shape[1] + 1)
        return j <= self.response_lengths.unsqueeze(1)

    def env_token_rewards(self) -> Tensor:
        """The environment reward of each turn on its last response token, ``[B, T]``."""
        out = torch.zeros(self.response_ids.shape)
        last = (self.response_lengths - 1).clamp(min=0)
        out[torch.arange(self.size), last] = self.rewards
        return out

    def _cells(self, x: Tensor, empty: float | bool) -> Tensor:
        """Per-turn ``x`` ``[B, ...]`` laid out as the estimators' ``[N, K, ...]`` grid (empty cells
        hold ``empty``)."""
        n, k = self.num_envs, self.turns_per_env
        if self.grid is None:
            return x.view(n, k, *x.shape[1:])
        out = x.new_full((n * k, *x.shape[1:]), empty)
        kept = self.grid >= 0
        out[self.grid[kept]] = x[kept]
        return out.view(n, k, *x.shape[1:])

    def _rows(self, x: Tensor, left_out: Tensor) -> Tensor:
        """The grid's ``[N, K, ...]`` ``x`` back on the turns ``[B, ...]``; turns not in the grid
        take ``left_out``'s rows."""
        if self.grid is None:
            return x.reshape(self.size, *x.shape[2:])
        out = left_out.clone()
        kept = self.grid >= 0
        out[kept] = x.reshape(-1, *x.shape[2:])[self.grid[kept]]
        return out

    def turn_batch(self) -> TurnBatch:
        """The ``verlog.algo`` view: ``[N, K, ...]``."""
        return TurnBatch(
            token_rewards=self._cells(self.token_rewards, 0.0),
            response_mask=self._cells(self.response_mask, False),
            terminated=self._cells(self.terminated, False),
            truncated=self._cells(self.truncated, False),
            values=None if self.values is None else self._cells(self.values, 0.0),
            bootstrap_values=self.bootstrap_values,
            truncation_values=None
            if self.truncation_values is None
            else self._cells(self.truncation_values, float("nan")),
        )

    def turn_data(self) -> TurnData:
        """The per-turn data estimators may need, ``[N, K]`` (``[N]`` for episode starts): each
        turn's seed as its group, each slot's episode start, each turn's anchor state."""
        return TurnData(
            groups=self._cells(self.seeds, -1),
            episode_starts=self.starts_episode,
            anchors=self._cells(self.anchors, -1),
        )

    # ------------------------------------------------------------------ advantages
    def set_estimate(self, estimate: Estimate) -> dict[str, float]:
        """Keep an estimator's advantages ``[B, T]``, critic targets ``[B, T + 1]`` and policy mask
        (turns not in the grid of whole groups: advantage ``0``, left out of the policy loss, their
        critic targets their own values)."""
        self.advantages = self._rows(
            estimate.advantages, torch.zeros_like(self.response_mask, dtype=estimate.advantages.dtype)
        )
        if estimate.returns is None:
            self.returns = None
        else:
            held = self.values if self.values is not None else torch.zeros(self.size, estimate.returns.shape[-1])
            self.returns = self._rows(estimate.returns, held.to(estimate.returns.dtype))
        metrics = dict(estimate.metrics)
        if (
            self.grid is not None and "dropped_turn_frac" in metrics
        ):  # a share of the batch's turns, not of the grid's cells
            metrics["dropped_turn_frac"] *= self.num_envs * self.turns_per_env / max(1, self.size)
        included = estimate.included
        if included is None and self.grid is not None:
            included = torch.ones(self.num_envs, self.turns_per_env, dtype=torch.bool)
        if included is None:
            self.policy_mask = self.response_mask
        else:
            rows = self._rows(included, torch.zeros(self.size, dtype=torch.bool))
            self.policy_mask = self.response_mask & rows.reshape(-1, 1)
        if self.grid is not None:  # the share of all the batch's response tokens, compared or not
            metrics["policy_token_frac"] = (self.policy_mask.sum() / self.response_mask.sum().clamp(min=1)).item()
        return metrics

    def compute_advantages(self, algo: AlgorithmConfig) -> dict[str, float]:
        """Advantages and critic targets with ``algo.estimator`` (``verlog.algo.estimators``); its metrics."""
        return self.set_estimate(estimate_advantages(algo, self.turn_batch(), self.turn_data()))

    # ------------------------------------------------------------------ batching
    @staticmethod
    def cat(storages: Sequence["RolloutStorage"]) -> "RolloutStorage":
        """Rows of several storages as one flat storage (critic warm-up buffer)."""
        width = max(s.response_ids.shape[1] for s in storages)

        def pad(x: Tensor, w: int) -> Tensor:
            return torch.nn.functional.pad(x, (0, w - x.shape[1]))

        first = storages[0]
        joined = {}
        for f in fields(first):
            values = [getattr(s, f.name) for s in storages]
            if f.name in (
                "num_envs",
                "turns_per_env",
                "bootstrap_prompts",
                "bootstrap_images",
                "starts_episode",
                "bootstrap_values",
                "grid",
            ):
                continue
            if f.name == "images":
                joined[f.name] = [] if not any(values) else [x for st in storages for x in _row_images(st)]
            elif f.name == "constraints":
                joined[f.name] = (
                    [] if not any(values) else [c for st in storages for c in st.constraints or [None] * st.size]
                )
            elif f.name == "unknown_grammars":
                joined[f.name] = sum(values)
            elif f.name == "token_masks":  # rebuilt for the joined rows when they are scored
                joined[f.name] = None
            elif f.name in ("sequences", "truncation_prompts"):
                joined[f.name] = [seq for v in values for seq in v]
            elif f.name == "trunk_states":
                joined[f.name] = None if any(v is None for v in values) else [x for v in values for x in v]
            elif values[0] is None:
                joined[f.name] = None
            elif values[0].dim() == 2:
                extra = 1 if f.name in ("values", "returns") else 0
                joined[f.name] = torch.cat([pad(v, width + extra) for v in values])
            else:
                joined[f.name] = torch.cat(values)
        total = sum(s.size for s in storages)
        return RolloutStorage(
            num_envs=1,
            turns_per_env=total,
            bootstrap_prompts=[],
            starts_episode=torch.zeros(0, dtype=torch.bool),
            **joined,
        )


def _row_images(storage: RolloutStorage) -> list[tuple[str, ...]]:
    return [storage.row_images(r) for r in range(storage.size)]
