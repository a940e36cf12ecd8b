"""PPO's estimator: Verlog's dual-discount GAE with the critic (the recursion is in
``verlog/algo/multiturn_gae.py``). Returns ``A + V`` are the critic's targets. The advantages are whitened
over the batch by default, as PPO implementations and Verlog do (``whitens=True``)."""

from __future__ import annotations

from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch, dual_gae


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    advantages, returns = dual_gae(batch, settings.gamma_step, settings.lam_step, settings.gamma_token, settings.lam_token)
    return Estimate(advantages, returns)


ESTIMATOR = AdvantageEstimator(
    name="gae",
    summary="dual-discount GAE with a critic (PPO, Verlog)",
    needs_critic=True,
    needs=frozenset(),
    compute=compute,
    whitens=True,
)
