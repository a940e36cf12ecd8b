"""GRPO (Shao et al., 2024, DeepSeekMath): group-normalized episode returns, no critic.

Episodes of one group play the same task (the slots of a ``trainer.group_size`` group play the
same seeds). With ``R_i`` the return of episode ``i`` of a group of ``G`` complete episodes::

    A_i = (R_i - mean_j R_j) / (std_j R_j + eps)      (group_norm: mean_std, the default; std unbiased)
    A_i =  R_i - mean_j R_j                           (group_norm: mean, Dr. GRPO)

broadcast to every token of every turn of the episode. A group whose returns are all equal (a tie:
all solved, all failed) gets exactly ``0``, as does a group of one (no baseline). The advantages are
not re-whitened over the batch (``algorithm.whiten_advantages: null`` keeps GRPO's own scale).
"""

from __future__ import annotations

import torch
from torch import Tensor

from verlog.algo.advantages import episodes_of, group_moments, tied_groups
from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch

__all__ = ["grpo_advantages"]


@torch.no_grad()
def grpo_advantages(
    batch: TurnBatch,
    group_ids: Tensor,
    starts_episode: Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO's advantages ``[N, K, T]`` and the turns that take part ``[N, K]`` bool.

    An episode's return ``R`` sums its token rewards (all turns, all tokens). ``group_ids``
    ``[N, K]`` gives each turn the group of its episode (constant inside an episode). Only
    complete episodes take part: one still running at the batch boundary has no return yet, and
    one that began in an earlier batch (``starts_episode`` ``[N]`` False for its slot) lacks its
    earlier rewards. A group with a single complete episode has no baseline, a group of equal
    returns no signal: advantage exactly ``0``.
    Multiply ``included`` into the loss mask (excluded turns have advantage ``0``).
    """
    ep = episodes_of(batch, group_ids, starts_episode)
    count, mean, var = group_moments(ep.returns, ep.complete, ep.group, ep.n_groups)
    advantage = ep.returns - mean[ep.group]
    if scale_by_std:
        advantage = advantage / (var.sqrt()[ep.group] + eps)
    zero = torch.zeros((), dtype=advantage.dtype, device=advantage.device)
    tied = tied_groups(ep.returns, ep.complete, ep.group, ep.n_groups)
    advantage = torch.where(ep.complete & (count[ep.group] >= 2) & ~tied[ep.group], advantage, zero)
    turn_advantage = ep.per_turn(advantage).unsqueeze(-1)
    return torch.where(batch.response_mask, turn_advantage, zero), ep.per_turn(ep.complete)


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, included = grpo_advantages(
        batch, data.groups, data.episode_starts, scale_by_std=settings.group_norm != "mean"
    )
    return Estimate(advantages, included=included)


ESTIMATOR = AdvantageEstimator(
    name="grpo",
    summary="group-normalized episode returns, no critic (GRPO)",
    needs_critic=False,
    needs=frozenset({"groups", "episode_starts"}),
    compute=compute,
)
