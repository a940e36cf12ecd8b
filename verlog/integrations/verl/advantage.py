"""The verl trainer's advantage step for verlog rows: dual-discount GAE from ``verlog.algo``.

``compute_turn_advantages(data, infos, gae)`` takes a verl ``DataProto`` of per-turn rows with the
critic's ``values`` (and, for KL-in-reward, ``old_log_probs`` / ``ref_log_prob``) and fills in what
verl's actor and critic updates read: ``token_level_scores`` (each turn's environment reward on
its last token), ``token_level_rewards`` (minus verl's KL penalty when enabled), ``advantages``
and ``returns``. The maths is ``verlog.algo.dual_gae`` (and ``whiten``) on the rows laid out as a
``TurnBatch`` (``verlog.integrations.verl.layout``); nothing here re-derives it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from verlog.algo import dual_gae, whiten
from verlog.integrations.verl.layout import RowLayout, rows_to_turn_batch, token_scores
from verlog.integrations.verl.samples import RowInfo
from verlog.integrations.verl.settings import VerlGAEConfig

__all__ = ["compute_turn_advantages", "rollout_metrics"]


def compute_turn_advantages(
    data: Any,
    infos: Sequence[RowInfo | None],
    gae: VerlGAEConfig,
    *,
    kl_ctrl: Any = None,
    kl_penalty: str = "kl",
) -> tuple[Any, dict[str, float]]:
    """Dual-discount GAE over a verl batch of verlog rows (in place; returns ``(data, metrics)``).

    Args:
        data: a ``DataProto`` whose batch has right-padded ``response_mask`` and ``values``
            (``[B, T]``), plus ``old_log_probs`` and ``ref_log_prob`` when ``kl_ctrl`` is given.
        infos: verlog's facts about each row (``samples.row_info``), ``None`` for rows to leave
            out (verl's padding rows).
        gae: the discounts and whether to whiten advantages over the batch's tokens.
        kl_ctrl: verl's KL controller for KL-in-reward (``algorithm.use_kl_in_reward``), or None.
    """
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    mask = data.batch["response_mask"]
    data.batch["token_level_scores"] = token_scores(mask, infos).to(data.batch["values"].dtype)
    metrics: dict[str, float] = {}
    if kl_ctrl is not None:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=kl_penalty)
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]

    batch, layout = rows_to_turn_batch(mask, data.batch["values"], data.batch["token_level_rewards"], infos)
    advantages, returns = dual_gae(
        batch, gamma_step=gae.gamma_step, lam_step=gae.lam_step,
        gamma_token=gae.gamma_token, lam_token=gae.lam_token,
    )
    if gae.whiten_advantages:
        advantages = whiten(advantages, batch.response_mask)
    width = mask.shape[1]
    float_mask = mask.to(data.batch["values"].dtype)
    data.batch["advantages"] = layout.scatter(advantages, width).to(float_mask.dtype) * float_mask
    data.batch["returns"] = layout.scatter(returns, width).to(float_mask.dtype) * float_mask
    metrics.update(rollout_metrics(infos, layout))
    if batch.truncation_values is not None:
        metrics["verlog/truncated_turns_bootstrapped"] = float(torch.isfinite(batch.truncation_values).sum())
    return data, metrics


def rollout_metrics(infos: Sequence[RowInfo | None], layout: RowLayout) -> dict[str, float]:
    """What the batch's slots did: turns, bootstrapped cuts, episodes ended and failed."""
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
