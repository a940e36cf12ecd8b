"""REINFORCE++ (Hu, 2025): discounted returns normalized over the whole batch, no critic.

The KL to the reference policy is a per-token reward (``algorithm.kl_coef``, folded into the
token rewards by ``kl_in_reward`` before the estimator), so every token's return carries the KL
of the tokens after it. With the dual discount of a multi-turn batch (``gamma_token`` inside a
response, ``gamma_step`` across turns; ``L_k`` tokens in turn ``k``)::

    G_{k,j} = sum_{j <= i < L_k} gamma_tok^(i-j) r_{k,i}  +  gamma_tok^(L_k-j) * gamma_step * G_{k+1,0}
    A = (G - mean(G)) / std(G)            over every token the policy loss uses in the batch

(``G_{k+1,0} = 0`` after a done turn). The batch normalization is part of the formula, so it is
applied whatever ``algorithm.whiten_advantages`` says. ``reinforce_pp_baseline`` subtracts a
group-mean baseline from episode returns instead of discounting. Without a critic nothing can stand in for the rewards of
an episode still running at the batch boundary: its turns sit the update out. Episodes that
began in an earlier batch take part (every reward after each of their turns is in the batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from verlog.algo.advantages import episodes_of, whiten
from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch, dual_gae

__all__ = ["reinforce_pp_advantages"]


@torch.no_grad()
def reinforce_pp_advantages(
    batch: TurnBatch, gamma_step: float = 1.0, gamma_token: float = 1.0
) -> tuple[Tensor, Tensor]:
    """REINFORCE++'s advantages ``[N, K, T]`` and the turns that take part ``[N, K]`` bool."""
    n, k, t = batch.token_rewards.shape
    dtype = batch.token_rewards.dtype if batch.token_rewards.is_floating_point() else torch.float32
    # the returns G are dual-discount GAE with V = 0 and lambda = 1 (the TD errors are the rewards)
    no_critic = TurnBatch(
        batch.token_rewards,
        batch.response_mask,
        batch.terminated,
        batch.truncated,
        values=torch.zeros(n, k, t + 1, dtype=dtype, device=batch.token_rewards.device),
        bootstrap_values=torch.zeros(n, dtype=dtype, device=batch.token_rewards.device),
    )
    returns, _ = dual_gae(no_critic, gamma_step, 1.0, gamma_token, 1.0)
    ep = episodes_of(batch)
    included = ep.per_turn(ep.ended)
    return whiten(returns, batch.response_mask & included.unsqueeze(-1)), included


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, included = reinforce_pp_advantages(batch, settings.gamma_step, settings.gamma_token)
    return Estimate(advantages, included=included)


ESTIMATOR = AdvantageEstimator(
    name="reinforce_pp",
    summary="discounted returns whitened over the batch, KL as a token reward, no critic (REINFORCE++)",
    needs_critic=False,
    needs=frozenset(),
    compute=compute,
)
