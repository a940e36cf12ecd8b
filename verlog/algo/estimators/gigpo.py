"""GiGPO (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): GRPO's
episode-level advantage plus a step-level advantage among turns that acted in the same state.

Episodes of one group play the same task (the slots of a ``trainer.group_size`` group play the
same seeds), so their trajectories pass through the same environment states — an *anchor state*
— at possibly different steps. The environment names the state each turn acted in
(``info["anchor"]`` reported with the turn's reward: the observation before the step, or a
key of it); a turn of a prompt built from a history window has the same anchor as any other turn
in that state, whatever the history.

With ``R_i`` the return of episode ``i``, ``r_t`` the reward of turn ``t``::

    A^E(tau_i) = (R_i - mean_j R_j) / F                  over the complete episodes of the group
    R^S_t      = sum_{t' >= t} gamma^(t'-t) r_t'          the turn's discounted step return (gamma_gigpo)
    A^S(a_t)   = (R^S_t - mean R^S) / F                  over the turns of the group in the same anchor state
    A          = A^E + omega * A^S                       (omega = gigpo_step_weight)

``F`` is the group's unbiased std (+ eps) with ``group_norm: mean_std``, ``1`` with ``mean``
(verl-agent's ``mean_norm``, and the default here). A group of one episode, or a state visited once, has no baseline:
its term is ``0``, and so is a group or a state whose returns are all equal (exactly: no rounding
left over). As in GRPO only episodes complete in the batch take part; not re-whitened over the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from verlog.algo.advantages import episodes_of, group_moments, tied_groups
from verlog.algo.estimators.grpo import grpo_advantages
from verlog.algo.estimators.registry import (
    AdvantageEstimator,
    AdvantageSettings,
    Estimate,
    EstimatorInputError,
    TurnData,
)
from verlog.algo.multiturn_gae import TurnBatch

__all__ = ["gigpo_advantages", "step_returns"]


def step_returns(turn_rewards: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """``R^S_t = r_t + gamma * (1 - d_t) * R^S_{t+1}`` backwards over each slot's turns ``[N, K]``
    (``0`` past the batch: only complete episodes use it)."""
    out = torch.zeros_like(turn_rewards)
    following = torch.zeros_like(turn_rewards[:, 0])
    not_done = (~dones).to(turn_rewards.dtype)
    for k in reversed(range(turn_rewards.shape[1])):
        following = turn_rewards[:, k] + gamma * not_done[:, k] * following
        out[:, k] = following
    return out


@torch.no_grad()
def gigpo_advantages(
    batch: TurnBatch,
    group_ids: Tensor,
    anchors: Tensor,
    starts_episode: Tensor | None = None,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """GiGPO's advantages ``[N, K, T]``, the turns that take part ``[N, K]`` bool, and metrics.

    ``group_ids`` ``[N, K]``: each turn's episode group (its seed); ``anchors`` ``[N, K]`` long:
    an id of the state each turn acted in (``-1``: unknown, no step-level term).
    Metrics: ``step_group_frac`` (share of the scored turns with an anchor whose state another scored
    turn of their group shares) and ``step_group_size`` (their mean anchor-group size).
    """
    episode_adv, included = grpo_advantages(batch, group_ids, starts_episode, scale_by_std, eps)
    ep = episodes_of(batch, group_ids, starts_episode)
    returns = step_returns(ep.turn_rewards, batch.dones, gamma)  # R^S_t, [N, K]

    # Step groups: (episode group, anchor state) pairs among the turns of complete episodes.
    member = (included & (anchors >= 0)).reshape(-1)
    pairs = torch.stack([ep.per_turn(ep.group).reshape(-1), anchors.reshape(-1).long()], dim=1)
    _, step_group = torch.unique(pairs, dim=0, return_inverse=True)
    n_step_groups = int(step_group.max()) + 1
    flat_returns = returns.reshape(-1)
    count, mean, var = group_moments(flat_returns, member, step_group, n_step_groups)
    step_adv = flat_returns - mean[step_group]
    if scale_by_std:
        step_adv = step_adv / (var.sqrt()[step_group] + eps)
    visited = member & (count[step_group] >= 2)  # a state another scored turn of the group shares
    shared = visited & ~tied_groups(flat_returns, member, step_group, n_step_groups)[step_group]
    zero = torch.zeros((), dtype=step_adv.dtype, device=step_adv.device)
    step_adv = torch.where(shared, step_adv, zero).reshape(included.shape)

    advantages = episode_adv + step_weight * torch.where(batch.response_mask, step_adv.unsqueeze(-1), zero)
    scored = max(int(member.sum()), 1)
    metrics = {
        "step_group_frac": float(visited.sum()) / scored,
        "step_group_size": float(count[step_group][visited].mean()) if bool(visited.any()) else 1.0,
    }
    return advantages, included, metrics


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, included, metrics = gigpo_advantages(
        batch,
        data.groups,
        data.anchors,
        data.episode_starts,
        gamma=settings.gigpo_gamma,
        step_weight=settings.gigpo_step_weight,
        scale_by_std=settings.group_norm == "mean_std",  # default: mean
    )
    if bool(included.any()) and not bool((data.anchors[included] >= 0).any()):
        # (a batch with no complete episode scores nothing: whether the graph reports anchors is unknown)
        raise EstimatorInputError(
            "algorithm.estimator: 'gigpo' compares turns that acted in the same state, and the graph names none: "
            "its environment node must report info['anchor'] (the state the turn acted in, e.g. the observation "
            "before the step) with each reward, as verlog's game graphs do; or choose an estimator without "
            "anchor states (grpo, rloo)"
        )
    return Estimate(advantages, included=included, metrics=metrics)


ESTIMATOR = AdvantageEstimator(
    name="gigpo",
    summary="GRPO's episode advantage plus a step advantage among turns in the same anchor state (GiGPO)",
    needs_critic=False,
    needs=frozenset({"groups", "anchors", "episode_starts"}),
    compute=compute,
)
