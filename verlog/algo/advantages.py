"""What the advantage estimators share: whitening, and the episodes and groups of a ``TurnBatch``.

A ``TurnBatch`` holds ``N`` slots x ``K`` consecutive turns; a slot's turns may span several
episodes (a done turn closes one). The group estimators (GRPO, RLOO, GiGPO) compare episodes of
the same task: ``episodes_of`` numbers the episodes, sums their rewards and tells which are
complete in the batch; ``group_moments`` gives per-group counts, means and variances; ``tied_groups`` tells which groups'
members all have the same value (no learning signal: their advantages are exactly ``0``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from verlog.algo.multiturn_gae import TurnBatch

__all__ = ["Episodes", "episode_index", "episodes_of", "group_moments", "tied_groups", "whiten"]


@torch.no_grad()
def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the valid entries (``mask``) of the whole batch.

    Mean and (population) variance are taken over valid entries only; invalid entries come out
    ``0``. With ``shift_mean=False`` the mean is added back (only the scale changes).
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    count = mask.sum().clamp(min=1)
    mean = torch.where(mask, x, zero).sum() / count
    var = torch.where(mask, (x - mean) ** 2, zero).sum() / count
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, zero)


def episode_index(dones: Tensor) -> Tensor:
    """Which episode of its slot each turn belongs to, ``[N, K]`` long: the number of done turns
    before it in the slot (a done turn closes its episode, the next turn opens a new one)."""
    done_count = dones.long().cumsum(dim=1)
    return done_count - dones.long()


@dataclass
class Episodes:
    """The episodes of a ``TurnBatch``, numbered ``e = slot * K + episode_index`` (``E = N * K``
    ids; ids no turn uses are neither ended nor complete).

    * ``of_turn`` ``[N, K]`` long: the episode of each turn.
    * ``turn_rewards`` ``[N, K]``: each turn's reward, summed over its response tokens.
    * ``returns`` ``[E]``: ``R = sum of the turn rewards`` of the episode's turns in the batch.
    * ``ended`` ``[E]`` bool: the episode's last turn in the batch is done.
    * ``complete`` ``[E]`` bool: it began and ended in the batch (its ``R`` is its whole return).
    * ``group`` ``[E]`` long: dense group index (``0..n_groups-1``) of each episode.
    """

    of_turn: Tensor
    turn_rewards: Tensor
    returns: Tensor
    ended: Tensor
    complete: Tensor
    group: Tensor
    n_groups: int

    def per_turn(self, x: Tensor) -> Tensor:
        """A per-episode ``[E]`` tensor read at each turn, ``[N, K]``."""
        return x[self.of_turn]


@torch.no_grad()
def episodes_of(batch: TurnBatch, group_ids: Tensor | None = None, starts_episode: Tensor | None = None) -> Episodes:
    """Number the episodes of ``batch`` and sum their rewards.

    ``group_ids`` ``[N, K]`` (int, constant inside an episode, e.g. the episode's seed) puts
    episodes of the same task in one group (default: one group each). ``starts_episode`` ``[N]``
    bool says whether each slot's first turn opens an episode (default: all do); an episode that
    began in an earlier batch lacks its earlier rewards and is not ``complete``.
    """
    n, k_turns, _ = batch.token_rewards.shape
    device = batch.token_rewards.device
    zero = torch.zeros((), dtype=batch.token_rewards.dtype, device=device)
    turn_rewards = torch.where(batch.response_mask, batch.token_rewards, zero).sum(-1)  # [N, K]
    dones = batch.dones

    slot = torch.arange(n, device=device).unsqueeze(1)
    of_turn = slot * k_turns + episode_index(dones)  # [N, K]
    flat = of_turn.reshape(-1)
    n_ids = n * k_turns
    returns = torch.zeros(n_ids, dtype=turn_rewards.dtype, device=device).index_add_(0, flat, turn_rewards.reshape(-1))
    ended = torch.zeros(n_ids, dtype=torch.bool, device=device)
    ended[flat[dones.reshape(-1)]] = True
    began = torch.ones(n_ids, dtype=torch.bool, device=device)
    if starts_episode is not None:  # the first episode of a slot may have begun in an earlier batch
        began[slot.squeeze(1) * k_turns] = starts_episode.to(device).bool()

    if group_ids is None:
        raw_group = torch.arange(n_ids, device=device)
    else:
        raw_group = torch.full((n_ids,), -1, dtype=torch.long, device=device)
        raw_group[flat] = group_ids.reshape(-1).to(device).long()
    _, group = torch.unique(raw_group, return_inverse=True)
    return Episodes(of_turn, turn_rewards, returns, ended, ended & began, group, int(group.max()) + 1)


@torch.no_grad()
def group_moments(x: Tensor, member: Tensor, group: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(count, mean, var)`` per group ``[n_groups]`` of the ``member`` entries of ``x``; ``var``
    is the unbiased variance (``0`` for groups of fewer than two)."""
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    count = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, group, member.to(x.dtype))
    mean = torch.zeros_like(count).index_add_(0, group, torch.where(member, x, zero)) / count.clamp(min=1)
    squares = torch.where(member, (x - mean[group]) ** 2, zero)
    var = torch.zeros_like(count).index_add_(0, group, squares) / (count - 1).clamp(min=1)
    return count, mean, var


@torch.no_grad()
def tied_groups(x: Tensor, member: Tensor, group: Tensor, n_groups: int, tolerance: float = 0.0) -> Tensor:
    """Which groups ``[n_groups]`` bool have members (``member`` entries of ``x``) and all of them
    within ``tolerance`` of each other (``0``: exactly equal).

    A tied group compares equal outcomes: its centred values are ``0`` in exact arithmetic, but
    ``x - mean`` in floating point is not always (``mean(0.1, 0.1, 0.1) != 0.1``), and a std
    scaling would blow that rounding up. The group estimators set their advantage to exactly ``0``;
    DAPO's dynamic sampling drops them from the policy loss.
    """
    lo = torch.full((n_groups,), float("inf"), dtype=x.dtype, device=x.device)
    hi = torch.full_like(lo, float("-inf"))
    lo.scatter_reduce_(0, group[member], x[member], "amin")
    hi.scatter_reduce_(0, group[member], x[member], "amax")
    scored = torch.zeros(n_groups, dtype=torch.bool, device=x.device)
    scored[group[member]] = True
    return scored & (hi - lo <= tolerance)
