"""Policy and value losses, one small function each, the maths in plain sight.

By default every loss is a token mean over a mask: ``sum(loss * mask) / sum(mask)`` over the
whole batch (every valid token weighs the same, whatever the length of its response: DAPO's
token-level loss); the policy losses can average per turn first (``aggregate``). Each returns the
loss (a differentiable scalar tensor) and a dict of float metrics.

Shapes are free as long as they broadcast: per-token tensors are typically ``[N, K, T]``
(policy) or ``[N, K, T + 1]`` (values, see ``TurnBatch``) or flattened ``[B, T]``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

# the policy losses by name (``algorithm.policy_loss``) live in a torch-free registry; re-exported here
from verlog.algo.loss_registry import POLICY_LOSSES, policy_loss_fn

__all__ = [
    "POLICY_LOSSES",
    "LossAggregation",
    "aggregate",
    "aggregation_weight",
    "clipped_value_loss",
    "entropy_bonus",
    "entropy_from_logits",
    "kl_in_reward",
    "kl_k1",
    "kl_k3",
    "gspo_policy_loss",
    "masked_mean",
    "policy_loss_fn",
    "ppo_policy_loss",
]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is true (``0`` if there are none)."""
    mask = mask.bool()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(mask, x, zero).sum() / mask.sum().clamp(min=1)


#: how a loss is averaged: ``token_mean`` — every valid token of the (mini-)batch weighs the
#: same (DAPO's token-level loss; verlog's default); ``sequence_mean`` — each turn's tokens are
#: averaged first, then the turns (GRPO's and GSPO's original sample-level loss)
LossAggregation = Literal["token_mean", "sequence_mean"]


def aggregate(x: Tensor, mask: Tensor, aggregation: LossAggregation = "token_mean") -> Tensor:
    """``x`` averaged over ``mask`` the ``aggregation`` way (rows = all dims but the last).

    ``token_mean``: ``sum(x * mask) / sum(mask)``; ``sequence_mean``: the mean over the rows that
    have a valid entry of each row's own masked mean.
    """
    if aggregation == "token_mean":
        return masked_mean(x, mask)
    if aggregation != "sequence_mean":
        raise ValueError(f"unknown loss aggregation {aggregation!r}; allowed: token_mean, sequence_mean")
    mask = mask.bool()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    per_row = torch.where(mask, x, zero).sum(-1) / mask.sum(-1).clamp(min=1)
    rows = mask.any(-1)
    return torch.where(rows, per_row, zero).sum() / rows.sum().clamp(min=1)


def aggregation_weight(mask: Tensor, aggregation: LossAggregation = "token_mean") -> float:
    """What ``aggregate`` divides by: valid tokens (``token_mean``) or rows with one
    (``sequence_mean``). A micro-batch's loss weighs ``weight(micro) / weight(mini-batch)``."""
    mask = mask.bool()
    return float(mask.sum() if aggregation == "token_mean" else mask.any(-1).sum())


def _clipped_surrogate(
    ratio: Tensor,
    log_ratio: Tensor,
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    clip_eps_high: float | None,
    dual_clip: float | None,
    aggregation: LossAggregation,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped objective both PPO and GSPO use, given their ratio (see ``ppo_policy_loss``)."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    eps_low, eps_high = clip_eps, clip_eps if clip_eps_high is None else clip_eps_high
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    if dual_clip is not None:
        loss_dual = torch.minimum(loss_ppo, -dual_clip * advantages)
        token_loss = torch.where(advantages < 0, loss_dual, loss_ppo)
    else:
        token_loss = loss_ppo
    loss = aggregate(token_loss, mask, aggregation)

    with torch.no_grad():
        valid = mask.bool()
        clipped = loss_clipped > loss_unclipped
        if dual_clip is not None:
            dual_clipped = (advantages < 0) & (loss_ppo > -dual_clip * advantages)
        else:
            dual_clipped = torch.zeros_like(clipped)
        metrics = {
            "policy_loss": loss.item(),
            "clip_frac": masked_mean(clipped.float(), valid).item(),
            "dual_clip_frac": masked_mean(dual_clipped.float(), valid).item(),
            "approx_kl": masked_mean(kl_k3(old_logp, logp), valid).item(),
            "approx_kl_k1": masked_mean(-log_ratio, valid).item(),
            "ratio_max": ratio[valid].max().item() if bool(valid.any()) else 1.0,
        }
    return loss, metrics


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    dual_clip: float | None = 3.0,
    clip_eps_high: float | None = None,
    aggregation: LossAggregation = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """Clipped PPO policy loss with dual clip and DAPO's clip-higher, averaged over ``mask``.

    With the token ratio ``rho = exp(logp - old_logp)``, ``eps_low = clip_eps`` and
    ``eps_high = clip_eps_high`` (default ``clip_eps``)::

        loss_ppo  = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
        loss      = min(loss_ppo, -c * A)   where A < 0   (dual clip, c = dual_clip > 1)
                  = loss_ppo                where A >= 0

    The dual clip bounds the loss of a token whose advantage is negative but whose ratio has
    grown large (``rho > c``), where plain PPO's loss ``-A * rho`` grows without limit.
    ``dual_clip=None`` gives plain PPO. DAPO's clip-higher (``eps_high > eps_low``, e.g. 0.28 vs
    0.2) leaves unlikely tokens with a positive advantage more room to grow (against entropy
    collapse). ``aggregation``: see ``aggregate`` (DAPO: ``token_mean``). Metrics: ``clip_frac``
    (tokens whose clipped term is the larger one, i.e. whose gradient is cut), ``dual_clip_frac``,
    ``approx_kl`` (k3 estimate of KL(old || new)), ``approx_kl_k1``, ``ratio_max``.
    """
    log_ratio = logp - old_logp
    return _clipped_surrogate(
        torch.exp(log_ratio),
        log_ratio,
        old_logp,
        logp,
        advantages,
        mask,
        clip_eps,
        clip_eps_high,
        dual_clip,
        aggregation,
    )


def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 3e-4,
    dual_clip: float | None = None,
    clip_eps_high: float | None = 4e-4,
    aggregation: LossAggregation = "sequence_mean",
) -> tuple[Tensor, dict[str, float]]:
    """GSPO's policy loss (Zheng et al., 2025): the ratio and its clip are per sequence (per turn).

    For turn ``i`` with ``|y_i|`` response tokens, the sequence ratio is the geometric mean of its
    token ratios, ``s_i = exp(1/|y_i| * sum_t (logp_{i,t} - old_logp_{i,t}))``. Every token uses
    ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` — equal to ``s_i`` in value, its gradient that of
    ``s_i`` (GSPO-token form, which takes per-token advantages)::

        loss = max(-A * s, -A * clip(s, 1 - eps_low, 1 + eps_high))     (+ dual clip if set)

    averaged ``aggregation``-wise (the paper: ``sequence_mean``). Clip ranges are far smaller
    than PPO's (the paper: 3e-4 / 4e-4), as a sequence ratio moves less than a token's.
    ``clip_frac`` counts tokens of clipped sequences. ``log s_{i,t}`` is capped at 10 against
    overflow, as verl does: a capped token's ratio is the constant ``e^10`` and passes no gradient.
    """
    valid = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(valid, logp - old_logp, zero)
    seq_log_ratio = log_ratio.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
    token_log_ratio = (seq_log_ratio.detach() + logp - logp.detach()).clamp(max=10.0)
    return _clipped_surrogate(
        torch.exp(token_log_ratio),
        log_ratio,
        old_logp,
        logp,
        advantages,
        mask,
        clip_eps,
        clip_eps_high,
        dual_clip,
        aggregation,
    )


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.5,
    first_value_weight: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss, token mean over ``mask`` (the value positions ``j = 0..L_k``).

    ::

        V_clip = V_old + clip(V - V_old, -clip, +clip)
        loss   = 1/2 * max((V - R)^2, (V_clip - R)^2)

    The new value may not move more than ``clip`` from the one the returns were built with
    (``clip=None``: no clipping). ``first_value_weight`` multiplies the term of position ``0`` of
    the last dim, the turn's ``V(s_k)`` read at the last prompt token: the value that links
    turns in the step-level recursion (Verlog weighs it x3). The sum is divided by the number of
    valid positions, so a weight of 3 makes that position count as three.
    Metrics: ``value_loss``, ``value_clip_frac``, ``value_mean``, ``explained_variance``.
    """
    if clip is None:
        v_clipped = values
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (v_clipped - returns) ** 2
    token_loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped)

    valid = mask.bool()
    weight = torch.ones_like(token_loss)
    if first_value_weight != 1.0:
        weight[..., 0] = first_value_weight
    zero = torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    loss = torch.where(valid, weight * token_loss, zero).sum() / valid.sum().clamp(min=1)

    with torch.no_grad():
        residual_var = _masked_var(returns - values, valid)
        returns_var = _masked_var(returns, valid)
        metrics = {
            "value_loss": loss.item(),
            "value_clip_frac": masked_mean((loss_clipped > loss_unclipped).float(), valid).item(),
            "value_mean": masked_mean(values, valid).item(),
            "explained_variance": (1 - residual_var / returns_var).item() if returns_var > 0 else float("nan"),
        }
    return loss, metrics


def _masked_var(x: Tensor, mask: Tensor) -> Tensor:
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim: ``H = -sum_v p_v log p_v`` (one per position).

    Half-precision logits are computed in float32; masked-out logits (``-inf``, ``p = 0``) add 0,
    and so does their gradient (``log p`` is replaced before the product: ``0 * -inf`` would make
    the backward pass NaN).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros((), dtype=p.dtype, device=p.device))).sum(-1)


def entropy_bonus(logits: Tensor, mask: Tensor, aggregation: LossAggregation = "token_mean") -> Tensor:
    """Entropy of the policy over ``mask``, averaged as the policy loss is (``aggregate``); subtract
    ``coef * entropy_bonus`` from the loss. Averaged the policy loss's way, it weighs each
    micro-batch as the loss does, so the bonus does not depend on how a mini-batch is split."""
    return aggregate(entropy_from_logits(logits), mask, aggregation)


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k1 estimate of KL(pi || pi_ref) from samples of pi: ``log pi - log pi_ref``
    (unbiased, noisy, can be negative)."""
    return logp - ref_logp


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from samples of pi: ``rho - 1 - log rho`` with
    ``rho = pi_ref / pi`` (unbiased, never negative, lower variance)."""
    log_rho = ref_logp - logp
    return torch.exp(log_rho) - 1.0 - log_rho


@torch.no_grad()
def kl_in_reward(
    token_rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    beta: float = 0.001,
) -> tuple[Tensor, dict[str, float]]:
    """KL penalty folded into the rewards: ``r_{k,j} <- r_{k,j} - beta * (log pi - log pi_ref)``.

    ``logp`` are the rollout policy's log-probs of the sampled tokens, ``ref_logp`` the reference
    policy's; padding (``~mask``) is left untouched. Call before the advantage estimator.
    Metrics: ``kl_k1`` and ``kl_k3`` token means, ``kl_beta``.
    """
    valid = mask.bool()
    kl = kl_k1(logp, ref_logp)
    rewards = torch.where(valid, token_rewards - beta * kl.to(token_rewards.dtype), token_rewards)
    metrics = {
        "kl_k1": masked_mean(kl, valid).item(),
        "kl_k3": masked_mean(kl_k3(logp, ref_logp), valid).item(),
        "kl_beta": float(beta),
    }
    return rewards, metrics
