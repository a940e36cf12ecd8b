"""Off-policy correction for recorded turns: decoupled PPO against the behaviour policy.

Turns recorded in production were sampled by the model version that served them (the behaviour
policy ``pi_behav``, whose logprobs the trace holds), not by the policy being trained. Decoupled
PPO (Hilton, Cobbe & Schulman, 2022, "Batch size-invariance for policy optimization"; the
"decoupled objective" AReaL uses for asynchronous RL) keeps two old policies apart:

* the **proximal** policy ``pi_prox`` — the current weights before this update (teacher-forced
  logprobs), the anchor of PPO's trust region;
* the **behaviour** policy ``pi_behav`` — what actually sampled the tokens.

Per token, with ``r = pi_theta / pi_prox`` and the importance weight ``w = pi_prox / pi_behav``::

    L = - w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)
    w = min(pi_prox / pi_behav, c)          (truncated at c = behaviour_weight_cap)
    w = w * decay ** staleness              (the user's staleness rule; 0 for dropped turns)

Because ``w >= 0`` multiplies both terms of the ``min`` (and the dual clip's ``-c A`` bound
alike), the decoupled loss is PPO's clipped loss against ``pi_prox`` with advantages ``w * A``:
:func:`decoupled_advantages` computes that, and the trainer's PPO step is unchanged.
:func:`decoupled_policy_loss` writes the objective out in full (the tests hold the two equal).

What is and is not corrected: the importance weight corrects the *policy gradient* for the
behaviour policy token by token; the critic's targets (GAE over the recorded turns) are not
reweighted, and truncation at ``c`` biases toward the behaviour policy's distribution where the
current policy has moved far from it (a bias traded for bounded variance, as in V-trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from verlog.algo.losses import masked_mean

__all__ = [
    "OffPolicyCorrection",
    "behaviour_weights",
    "decoupled_advantages",
    "decoupled_policy_loss",
    "staleness_weights",
]


@dataclass(frozen=True)
class OffPolicyCorrection:
    """The settings of the correction: the truncation ``c`` of the importance weight, and the
    staleness rule (turns more than ``max_versions`` versions behind are dropped; the others
    weigh ``decay ** staleness``)."""

    behaviour_weight_cap: float = 2.0
    max_versions: int | None = None
    decay: float = 1.0

    def __post_init__(self) -> None:
        if self.behaviour_weight_cap < 1:
            raise ValueError(f"behaviour_weight_cap must be >= 1, got {self.behaviour_weight_cap}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if self.max_versions is not None and self.max_versions < 0:
            raise ValueError(f"max_versions must be >= 0 (or None), got {self.max_versions}")


def staleness_weights(staleness: Tensor, max_versions: int | None, decay: float) -> Tensor:
    """Per-turn weights from each turn's staleness (updates behind the trained weights, ``>= 0``;
    ``inf``: not in their lineage): ``decay ** staleness``, and ``0`` beyond ``max_versions`` or
    off the lineage (dropped)."""
    staleness = staleness.float()
    weights = torch.where(torch.isinf(staleness), torch.zeros_like(staleness), decay**staleness)
    if max_versions is not None:
        weights = torch.where(staleness > max_versions, torch.zeros_like(weights), weights)
    return weights


def behaviour_weights(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """``w = min(pi_prox / pi_behav, c)`` per token (``0`` off ``mask``)."""
    w = torch.exp(proximal_logprobs - behaviour_logprobs).clamp(max=cap)
    return torch.where(mask.bool(), w, torch.zeros_like(w))


def decoupled_advantages(
    advantages: Tensor,
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    mask: Tensor,
    turn_weights: Tensor,
    correction: OffPolicyCorrection,
) -> tuple[Tensor, dict[str, float]]:
    """``w * A`` per token (``[B, T]``), ``w`` the truncated importance weight times the turn's
    staleness weight (``turn_weights`` ``[B]``); PPO against ``pi_prox`` on these is decoupled PPO.

    Metrics: the mean weight, the share of tokens truncated at the cap, the mean staleness weight.
    """
    raw = torch.exp(proximal_logprobs - behaviour_logprobs)
    w = behaviour_weights(proximal_logprobs, behaviour_logprobs, mask, correction.behaviour_weight_cap)
    w = w * turn_weights.to(w).unsqueeze(-1)
    metrics = {
        "behaviour_weight": masked_mean(w, mask).item(),
        "behaviour_weight_truncated": masked_mean((raw > correction.behaviour_weight_cap).float(), mask).item(),
        "staleness_weight": turn_weights.float().mean().item() if turn_weights.numel() else 1.0,
    }
    return advantages * w, metrics


def decoupled_policy_loss(
    logp: Tensor,
    proximal_logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    cap: float = 2.0,
    turn_weights: Tensor | None = None,
) -> Tensor:
    """The decoupled PPO objective written out (token mean over ``mask``, no dual clip)::

    L = - min(pi_prox / pi_behav, c) * min(r * A, clip(r, 1 - eps, 1 + eps) * A),  r = pi_theta / pi_prox
    """
    r = torch.exp(logp - proximal_logp)
    w = torch.exp(proximal_logp - behaviour_logp).clamp(max=cap)
    if turn_weights is not None:
        w = w * turn_weights.unsqueeze(-1)
    surrogate = torch.minimum(r * advantages, r.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    return masked_mean(-w * surrogate, mask)
