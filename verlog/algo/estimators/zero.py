"""The control experiment: every advantage is ``0``, so the policy has nothing to learn from.

The critic still trains on dual-discount GAE's returns (the run is PPO in every other respect):
a learning curve that rises under this estimator means something other than the advantages
moves the policy (the entropy bonus alone must not).
"""

from __future__ import annotations

import torch

from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch, dual_gae


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    _, returns = dual_gae(batch, settings.gamma_step, settings.lam_step, settings.gamma_token, settings.lam_token)
    return Estimate(torch.zeros_like(batch.token_rewards), returns)


ESTIMATOR = AdvantageEstimator(
    name="zero",
    summary="advantages zeroed: a control that must not learn (the critic still trains)",
    needs_critic=True,
    needs=frozenset(),
    compute=compute,
    learns=False,
)
