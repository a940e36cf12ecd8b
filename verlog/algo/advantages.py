"""Advantage post-processing and critic-free advantages: whitening and GRPO, in ``TurnBatch`` format."""

from __future__ import annotations

import torch
from torch import Tensor

from verlog.algo.gae import TurnBatch

__all__ = ["episode_index", "grpo_advantages", "whiten"]


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


@torch.no_grad()
def grpo_advantages(
    batch: TurnBatch,
    group_ids: Tensor,
    starts_episode: Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO: group-normalized episode returns, broadcast to every token of every turn of the episode.

    Episodes are the runs of turns of one slot closed by ``done``. An episode's return is
    ``R = sum of its token rewards`` (all turns, all tokens). ``group_ids`` ``[N, K]`` (int) gives
    each turn the task/group of its episode (episodes of the same task share it; it must be
    constant inside an episode). Within each group of complete episodes::

        A = (R - mean_group(R)) / (std_group(R) + eps)      (std: unbiased; no division
                                                            when scale_by_std=False, Dr. GRPO)

    Only complete episodes take part: an episode still running at the batch boundary (its last
    turn in the batch is not done) has no return yet, and one that began in an earlier batch
    lacks its earlier rewards: ``starts_episode`` ``[N]`` bool says whether each slot's first
    turn opens an episode (default: all do; a turn after a done always does). A group with a
    single complete episode has no baseline: its advantage is ``0``.

    Returns ``(advantages [N, K, T], included [N, K] bool)``: ``included`` marks the turns of the
    episodes that took part (multiply it into the loss mask; excluded turns have advantage 0).
    """
    n, k_turns, _ = batch.token_rewards.shape
    device = batch.token_rewards.device
    zero = torch.zeros((), dtype=batch.token_rewards.dtype, device=device)
    turn_reward = torch.where(batch.response_mask, batch.token_rewards, zero).sum(-1)  # [N, K]
    dones = batch.dones

    # One id per (slot, episode-in-slot); a slot holds at most K episodes.
    slot = torch.arange(n, device=device).unsqueeze(1)
    episode = (slot * k_turns + episode_index(dones)).reshape(-1)
    n_ids = n * k_turns

    episode_return = torch.zeros(n_ids, dtype=turn_reward.dtype, device=device)
    episode_return.index_add_(0, episode, turn_reward.reshape(-1))
    ended = torch.zeros(n_ids, dtype=torch.bool, device=device)
    ended[episode[dones.reshape(-1)]] = True
    began = torch.ones(n_ids, dtype=torch.bool, device=device)
    if starts_episode is not None:  # the first episode of a slot may have begun in an earlier batch
        began[slot.squeeze(1) * k_turns] = starts_episode.bool()
    complete = ended & began

    # Group statistics over complete episodes.
    episode_group = torch.zeros(n_ids, dtype=torch.long, device=device)
    episode_group[episode] = group_ids.reshape(-1).long()
    _, group = torch.unique(episode_group, return_inverse=True)
    n_groups = int(group.max()) + 1
    weight = complete.to(turn_reward.dtype)
    count = torch.zeros(n_groups, dtype=turn_reward.dtype, device=device).index_add_(0, group, weight)
    total = torch.zeros_like(count).index_add_(0, group, weight * episode_return)
    mean = total / count.clamp(min=1)
    squares = weight * (episode_return - mean[group]) ** 2
    var = torch.zeros_like(count).index_add_(0, group, squares) / (count - 1).clamp(min=1)
    advantage = episode_return - mean[group]
    if scale_by_std:
        advantage = advantage / (var.sqrt()[group] + eps)
    advantage = torch.where(complete & (count[group] >= 2), advantage, zero)

    included = complete[episode].reshape(n, k_turns)
    turn_advantage = advantage[episode].reshape(n, k_turns, 1)
    advantages = torch.where(batch.response_mask, turn_advantage, zero)
    return advantages, included
