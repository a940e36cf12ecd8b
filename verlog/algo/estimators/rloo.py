"""RLOO (Ahmadian et al., 2024, "Back to Basics"): REINFORCE with a leave-one-out baseline.

Each episode is compared with the mean return of the *other* complete episodes of its group
(``G`` of them, the same task)::

    A_i = R_i - 1/(G-1) * sum_{j != i} R_j  =  G/(G-1) * (R_i - mean_j R_j)

broadcast to every token of every turn of the episode; no critic, no division by a std. As in
GRPO, only complete episodes take part, and a group of one (no baseline) or of equal returns (no
signal) gets exactly ``0``. Not re-whitened over the batch (the paper's scale).
"""

from __future__ import annotations

import torch
from torch import Tensor

from verlog.algo.advantages import episodes_of, group_moments, tied_groups
from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch

__all__ = ["rloo_advantages"]


@torch.no_grad()
def rloo_advantages(batch: TurnBatch, group_ids: Tensor, starts_episode: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """RLOO's advantages ``[N, K, T]`` and the turns that take part ``[N, K]`` bool (the turns
    of episodes complete in the batch)."""
    ep = episodes_of(batch, group_ids, starts_episode)
    count, mean, _ = group_moments(ep.returns, ep.complete, ep.group, ep.n_groups)
    g = count[ep.group]
    leave_one_out = (g * mean[ep.group] - ep.returns) / (g - 1).clamp(min=1)  # mean of the others
    zero = torch.zeros((), dtype=ep.returns.dtype, device=ep.returns.device)
    tied = tied_groups(ep.returns, ep.complete, ep.group, ep.n_groups)[ep.group]
    advantage = torch.where(ep.complete & (g >= 2) & ~tied, ep.returns - leave_one_out, zero)
    turn_advantage = ep.per_turn(advantage).unsqueeze(-1)
    return torch.where(batch.response_mask, turn_advantage, zero), ep.per_turn(ep.complete)


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, included = rloo_advantages(batch, data.groups, data.episode_starts)
    return Estimate(advantages, included=included)


ESTIMATOR = AdvantageEstimator(
    name="rloo",
    summary="REINFORCE with a leave-one-out group baseline, no critic (RLOO)",
    needs_critic=False,
    needs=frozenset({"groups", "episode_starts"}),
    compute=compute,
)
