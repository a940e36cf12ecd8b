"""The verl trainer's advantage step for verlog rows: verlog's estimator registry on verl's batch.

``compute_turn_advantages(data, infos, settings)`` takes a verl ``DataProto`` of per-turn rows
(with the critic's ``values`` when the estimator has a critic; ``old_log_probs`` / ``ref_log_prob``
for KL-in-reward) and fills in what verl's actor and critic updates read: ``token_level_scores``
(each turn's environment reward on its last token), ``token_level_rewards`` (minus verl's KL
penalty when enabled), ``advantages``, ``returns`` and, when the estimator leaves turns out of the
policy loss, ``response_mask``. The maths is ``verlog.algo.estimators.estimate_advantages`` — the
call the embedded trainer makes — on the rows laid out as a ``TurnBatch`` plus ``TurnData``
(``verlog.integrations.verl.layout``); nothing here re-derives it.

Everything written is float32 whatever dtype the critic's values arrive in: verl's critic runs
under bf16 autocast, and a bf16 advantage, return or reward keeps 3 significant digits (a reward
of 0.901563 would be stored as 0.902344); the values are read as float32 and the maths runs there.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from verlog.algo.estimators import AdvantageSettings, estimate_advantages, get_estimator
from verlog.integrations.verl.layout import RowLayout, rows_to_turn_batch, token_scores, turn_data
from verlog.integrations.verl.samples import RowInfo

__all__ = ["compute_turn_advantages", "slot_row_metrics"]


def compute_turn_advantages(
    data: Any,
    infos: Sequence[RowInfo | None],
    settings: AdvantageSettings,
    *,
    kl_ctrl: Any = None,
    kl_penalty: str = "kl",
) -> tuple[Any, dict[str, float]]:
    """``settings.estimator`` over a verl batch of verlog rows (in place; returns ``(data, metrics)``).

    Args:
        data: a ``DataProto`` whose batch has the right-padded ``response_mask`` (``[B, T]``), the
            critic's ``values`` when the estimator needs a critic, plus ``old_log_probs`` and
            ``ref_log_prob`` when ``kl_ctrl`` is given.
        infos: verlog's facts about each row (``samples.row_info``), ``None`` for rows to leave
            out (verl's padding rows).
        settings: the estimator and its settings (``settings.EstimatorSettings``).
        kl_ctrl: verl's KL controller for KL-in-reward (``algorithm.use_kl_in_reward``), or None.

    Written: ``advantages``; ``returns`` (the critic's targets; without a critic the advantages,
    as verl's own critic-free estimators write them, for its metrics); ``response_mask`` less the
    turns the estimator leaves out of the policy loss (e.g. GRPO's incomplete episodes), when it
    leaves any out. Metrics: the estimator's own under ``verlog/adv/``, and the rollout's.
    """
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    estimator = get_estimator(settings.estimator)
    mask = data.batch["response_mask"]
    values = data.batch["values"].float() if estimator.needs_critic else None
    data.batch["token_level_scores"] = token_scores(mask, infos).float()
    metrics: dict[str, float] = {}
    if kl_ctrl is not None:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=kl_penalty)
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]

    batch, layout = rows_to_turn_batch(mask, values, data.batch["token_level_rewards"], infos)
    estimate = estimate_advantages(settings, batch, turn_data(infos, layout))
    width = mask.shape[1]
    float_mask = mask.float()
    data.batch["advantages"] = layout.scatter(estimate.advantages, width).float() * float_mask
    returns = estimate.advantages if estimate.returns is None else estimate.returns
    data.batch["returns"] = layout.scatter(returns, width).float() * float_mask
    if estimate.included is not None:
        per_turn = estimate.included.unsqueeze(-1).expand(-1, -1, width)
        used = layout.scatter(per_turn.to(torch.int8), width).bool()
        data.batch["response_mask"] = (mask.bool() & used).to(mask.dtype)
    metrics.update({f"verlog/adv/{name}": float(value) for name, value in estimate.metrics.items()})
    metrics.update(slot_row_metrics(infos, layout))
    if batch.truncation_values is not None:
        metrics["verlog/truncated_turns_bootstrapped"] = float(torch.isfinite(batch.truncation_values).sum())
    return data, metrics


def slot_row_metrics(infos: Sequence[RowInfo | None], layout: RowLayout) -> dict[str, float]:
    """What the slots behind a verl batch's rows did: turns, bootstrapped cuts, episodes ended and
    failed (the embedded trainer's counterpart is ``verlog.train.metrics.rollout_metrics``)."""
    returns, lengths, success = [], [], []
    failed: dict[str, int] = {}
    for info in infos:
        summary = info.summary if info is not None else None
        if not summary:
            continue
        returns += summary.get("returns", [])
        lengths += summary.get("lengths", [])
        success += summary.get("success", [])
        for status, count in (summary.get("failed") or {}).items():
            failed[status] = failed.get(status, 0) + int(count)
    metrics: dict[str, float] = {
        "verlog/trajectories": float(len(layout.trajectories)),
        "verlog/turns": float(sum(layout.turn_counts)),
        "verlog/bootstrapped_turns": float(sum(layout.has_bootstrap)),
        "verlog/episodes_ended": float(len(returns)),
        "verlog/failed_episodes": float(sum(failed.values())),
    }
    for status, count in failed.items():
        metrics[f"verlog/failed_episodes/{status}"] = float(count)
    if returns:
        metrics["verlog/episode_return/mean"] = float(np.mean(returns))
        metrics["verlog/episode_turns/mean"] = float(np.mean(lengths))
    if success:
        metrics["verlog/success_rate"] = float(np.mean(success))
    return metrics
