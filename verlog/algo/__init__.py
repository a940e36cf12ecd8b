"""The RL maths of verlog, pure torch: advantages (dual-discount GAE, GRPO), PPO losses and
the critic warm-up schedule. Nothing here knows about engines, models or graphs."""

from verlog.algo.advantages import episode_index, grpo_advantages, whiten
from verlog.algo.critic_warmup import CriticWarmup, WarmupPlan
from verlog.algo.gae import TurnBatch, classic_gae, discounted_reverse_cumsum, dual_gae, next_state_values
from verlog.algo.losses import (
    clipped_value_loss,
    entropy_bonus,
    entropy_from_logits,
    kl_in_reward,
    kl_k1,
    kl_k3,
    masked_mean,
    ppo_policy_loss,
)

__all__ = [
    "CriticWarmup",
    "TurnBatch",
    "WarmupPlan",
    "classic_gae",
    "clipped_value_loss",
    "discounted_reverse_cumsum",
    "dual_gae",
    "entropy_bonus",
    "entropy_from_logits",
    "episode_index",
    "grpo_advantages",
    "kl_in_reward",
    "kl_k1",
    "kl_k3",
    "masked_mean",
    "next_state_values",
    "ppo_policy_loss",
    "whiten",
]
