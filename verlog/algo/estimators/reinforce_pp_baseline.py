"""REINFORCE++-baseline (Hu et al., 2025, "REINFORCE++", arXiv 2501.03262): each episode's return
minus the mean return of its group, then normalized over the whole batch; no critic.

Episodes of one group play the same task (the slots of a ``trainer.group_size`` group play the
same seeds). With ``R_i`` the return of episode ``i`` of a group of ``G`` complete episodes::

    A'_i = R_i - mean_j R_j                        the group-mean baseline (Dr. GRPO's advantage)
    A    = (A' - mean A') / std A'                 over every token the policy loss uses in the batch

``A'_i`` is broadcast to every token of every turn of episode ``i`` before the batch
normalization, so the mean and std are token-weighted (verl's ``reinforce_plus_plus_baseline``).
The group baseline removes the task's difficulty; the batch std (not the group's) scales, which
keeps a group of near-equal returns from being blown up to full-size advantages.

As in GRPO only complete episodes take part, and a group of one complete episode (no baseline)
or of equal returns (no signal) has ``A' = 0``; after the batch normalization those turns carry
``-mean A' / std A'`` (the token-weighted mean of the centred returns, close to ``0``). verl gives
a group of one its raw return instead; here ``trainer.group_size`` > 1 is expected.
"""

from __future__ import annotations

from torch import Tensor

from verlog.algo.advantages import whiten
from verlog.algo.estimators.grpo import grpo_advantages
from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch

__all__ = ["reinforce_pp_baseline_advantages"]


def reinforce_pp_baseline_advantages(
    batch: TurnBatch, group_ids: Tensor, starts_episode: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline's advantages ``[N, K, T]`` and the turns that take part ``[N, K]`` bool
    (the turns of episodes complete in the batch)."""
    centred, included = grpo_advantages(batch, group_ids, starts_episode, scale_by_std=False)
    return whiten(centred, batch.response_mask & included.unsqueeze(-1)), included


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, included = reinforce_pp_baseline_advantages(batch, data.groups, data.episode_starts)
    return Estimate(advantages, included=included)


ESTIMATOR = AdvantageEstimator(
    name="reinforce_pp_baseline",
    summary="episode return minus its group's mean, then whitened over the batch, no critic (REINFORCE++-baseline)",
    needs_critic=False,
    needs=frozenset({"groups", "episode_starts"}),
    compute=compute,
)
