"""PPO's estimator: Verlog's dual-discount GAE with the critic (the recursion is in
``verlog/algo/multiturn_gae.py``). Returns ``A + V`` are the critic's targets. The advantages are whitened
over the batch by default, as PPO implementations and Verlog do (``whitens=True``).

``bootstrap_cuts=False`` (an ablation) treats every cut episode as terminated: the turn cut by the
batch boundary and the turn cut by a time limit get ``V_next = 0`` instead of the critic's value of
the state that follows them."""

from __future__ import annotations

from dataclasses import replace

from verlog.algo.estimators.registry import AdvantageEstimator, AdvantageSettings, Estimate, TurnData
from verlog.algo.multiturn_gae import TurnBatch, dual_gae


def without_bootstrap(batch: TurnBatch) -> TurnBatch:
    """``batch`` with every cut treated as an end: the slots' last turns and the truncated turns
    bootstrap from ``0``, and a slot's last turn stops the advantage like a terminated one."""
    cut = batch.truncated.clone()
    cut[:, -1] = True  # the batch boundary
    return replace(batch, terminated=batch.terminated | cut, bootstrap_values=None, truncation_values=None)


def compute(batch: TurnBatch, data: TurnData, settings: AdvantageSettings) -> Estimate:
    if not settings.bootstrap_cuts:
        batch = without_bootstrap(batch)
    advantages, returns = dual_gae(
        batch, settings.gamma_step, settings.lam_step, settings.gamma_token, settings.lam_token
    )
    return Estimate(advantages, returns)


ESTIMATOR = AdvantageEstimator(
    name="gae",
    summary="dual-discount GAE with a critic (PPO, Verlog)",
    needs_critic=True,
    needs=frozenset(),
    compute=compute,
    whitens=True,
)
