"""The RL maths of verlog, pure torch: advantage estimators (one registry: dual-discount GAE,
GRPO, GiGPO, RLOO, REINFORCE++ and its group baseline, the zero control), policy and value losses (PPO with dual clip
and clip-higher, GSPO) and the critic warm-up schedule. Nothing here knows about engines, models
or graphs.

Names are imported on first use, so ``verlog.algo.estimators.registry`` (which the config reads
for the allowed ``algorithm.estimator`` values) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "verlog.algo.advantages": ("Episodes", "episode_index", "episodes_of", "group_moments", "tied_groups", "whiten"),
    "verlog.algo.critic_warmup": ("CriticWarmup", "WarmupPlan"),
    "verlog.algo.multiturn_gae": (
        "TurnBatch",
        "classic_gae",
        "discounted_reverse_cumsum",
        "dual_gae",
        "next_state_values",
    ),
    "verlog.algo.losses": (
        "aggregate",
        "aggregation_weight",
        "clipped_value_loss",
        "entropy_bonus",
        "entropy_from_logits",
        "gspo_policy_loss",
        "kl_in_reward",
        "kl_k1",
        "kl_k3",
        "masked_mean",
        "policy_loss_fn",
        "ppo_policy_loss",
    ),
    "verlog.algo.sft": ("monte_carlo_returns", "sft_loss"),
    "verlog.algo.estimators.grpo": ("grpo_advantages",),
    "verlog.algo.estimators.gigpo": ("gigpo_advantages",),
    "verlog.algo.estimators.rloo": ("rloo_advantages",),
    "verlog.algo.estimators.reinforce_pp": ("reinforce_pp_advantages",),
    "verlog.algo.estimators.reinforce_pp_baseline": ("reinforce_pp_baseline_advantages",),
    "verlog.algo.estimators.registry": (
        "AdvantageEstimator",
        "Estimate",
        "TurnData",
        "check_estimator_settings",
        "estimate_advantages",
        "estimator_names",
        "get_estimator",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'verlog.algo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from verlog.algo.advantages import Episodes, episode_index, episodes_of, group_moments, tied_groups, whiten
    from verlog.algo.critic_warmup import CriticWarmup, WarmupPlan
    from verlog.algo.estimators.gigpo import gigpo_advantages
    from verlog.algo.estimators.grpo import grpo_advantages
    from verlog.algo.estimators.registry import (
        AdvantageEstimator,
        Estimate,
        TurnData,
        check_estimator_settings,
        estimate_advantages,
        estimator_names,
        get_estimator,
    )
    from verlog.algo.estimators.reinforce_pp import reinforce_pp_advantages
    from verlog.algo.estimators.reinforce_pp_baseline import reinforce_pp_baseline_advantages
    from verlog.algo.estimators.rloo import rloo_advantages
    from verlog.algo.losses import (
        aggregate,
        aggregation_weight,
        clipped_value_loss,
        entropy_bonus,
        entropy_from_logits,
        gspo_policy_loss,
        kl_in_reward,
        kl_k1,
        kl_k3,
        masked_mean,
        policy_loss_fn,
        ppo_policy_loss,
    )
    from verlog.algo.multiturn_gae import TurnBatch, classic_gae, discounted_reverse_cumsum, dual_gae, next_state_values
    from verlog.algo.sft import monte_carlo_returns, sft_loss
