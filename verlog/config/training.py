"""The sections of a training run: the batch shape and checkpoints (``trainer``), the actor and
the critic (optimizers, LoRA, trained layers), the algorithm (advantage estimator, PPO) and the
critic's pre-training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from verlog.config.base import _Section

if TYPE_CHECKING:
    from verlog.registry import Registry


class OverlapConfig(_Section):
    """Overlapped updates: the slots go on playing the next batch with the weights they have while
    the trainer trains this one (``verlog.train.pipeline``); the new weights reach the engine between
    two calls once the update ends. A turn's staleness (the updates between the weights that sampled
    it and those its update starts from) never exceeds ``max_staleness``, and the policy loss is
    decoupled PPO against the weights the update starts from (``verlog.algo.off_policy``)."""

    enabled: bool = Field(False, description="train batch k while the slots play batch k+1 (false: alternate)")
    max_staleness: int = Field(
        1,
        ge=1,
        description="the most updates a trained turn's weights may lie behind the weights its update starts "
        "from (the rollout waits for the trainer rather than go further ahead)",
    )
    behaviour_weight_cap: float = Field(
        2.0, ge=1, description="truncation c of each token's importance weight pi_proximal / pi_behaviour"
    )
    update_in: Literal["auto", "process", "thread"] = Field(
        "auto",
        description="where the updates run beside the rollout: a process of their own (a CPU learner: the two do "
        "not take turns at Python's interpreter lock), a thread of the trainer's (a GPU learner); auto: by device",
    )


class StragglerConfig(_Section):
    """Straggler-tolerant batches (``verlog.rollout.slots``): a batch closes once ``num_envs x
    turns_per_env`` turns exist from any slots, a slot giving at most ``max_turns_per_env``, so a slot
    slowed by a tool gives its turns to a later batch instead of holding this one."""

    enabled: bool = Field(False, description="close a batch on its turn count, not when every slot gave its quota")
    max_turns_per_env: int | None = Field(
        None, ge=1, description="the most turns one slot gives a batch (default: twice turns_per_env)"
    )


class TrainerConfig(_Section):
    """The training run: batch shape (fixed-turn: ``num_envs`` slots x ``turns_per_env``),
    length, checkpoints and where everything is written."""

    run_dir: str = Field("runs/default", description="checkpoints, metrics.jsonl, eval.json, wandb files")
    total_updates: int = Field(100, ge=0, description="PPO updates (one batch each)")
    num_envs: int = Field(32, ge=1, description="persistent env slots")
    turns_per_env: int = Field(8, ge=1, description="turns each slot gives to every batch")
    group_size: int = Field(1, ge=1, description="consecutive slots playing the same seeds (GRPO groups)")
    save_every: int = Field(10, ge=0, description="checkpoint every N updates (0: only at the end)")
    keep_checkpoints: int = Field(3, ge=1, description="most recent checkpoints kept")
    eval_every: int = Field(0, ge=0, description="evaluate every N updates (0: never during training)")
    stop_at_win_rate: float | None = Field(
        None, gt=0, le=1, description="stop early once a periodic evaluation reaches this win rate (needs eval_every)"
    )
    stop_at_env_steps: int | None = Field(
        None,
        ge=1,
        description="stop after the update at which the environment steps played (turns_total, the critic "
        "warm-up's included) reach this; total_updates stays the ceiling. A budget in steps for batches whose size "
        "varies (whole groups)",
    )
    init_from: str | None = Field(
        None,
        description="start from this run's latest checkpoint (a verlog sft run, or any training run's): its policy, "
        "and its critic when it saved one; the reference policy of the KL is that policy too (verlog train --init-from)",
    )
    max_consecutive_failures: int = Field(20, ge=1, description="a slot failing this often in a row stops the run")
    seed: int = Field(0, description="torch / python RNG seed")
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads of the training passes (default: every core for those nothing runs beside: "
        "alternating updates, the critic's pre-training; all cores but one for overlapped updates, beside the rollout)",
    )
    overlap: OverlapConfig = Field(default_factory=OverlapConfig)
    stragglers: StragglerConfig = Field(default_factory=StragglerConfig)

    @model_validator(mode="after")
    def _check_groups(self) -> "TrainerConfig":
        if self.num_envs % self.group_size:
            raise ValueError(f"group_size ({self.group_size}) must divide num_envs ({self.num_envs})")
        if self.stop_at_win_rate is not None and not self.eval_every:
            raise ValueError("stop_at_win_rate needs periodic evaluations: set eval_every > 0")
        cap = self.stragglers.max_turns_per_env
        if cap is not None and cap < self.turns_per_env:
            raise ValueError(
                f"stragglers.max_turns_per_env ({cap}) must be >= turns_per_env ({self.turns_per_env}): "
                "a batch of num_envs x turns_per_env turns could not be filled"
            )
        return self


class LoRAConfig(_Section):
    """Optional LoRA adapters on the actor (needs ``peft``; rank 0 = full fine-tuning)."""

    rank: int = Field(0, ge=0)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field("all-linear", description="module names, or 'all-linear'")


class OptimConfig(_Section):
    """One model's optimizer (AdamW)."""

    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping (null: off)")


class TrainedModelConfig(OptimConfig):
    """What the actor and the critic share: their optimizer, and how much of the model trains."""

    gradient_checkpointing: bool = False
    train_layers: int | None = Field(
        None,
        ge=1,
        description="only the last N transformer layers (and the final norm; the critic's value head) "
        "train, the rest keeps its starting weights: backward passes stop at layer N, a fraction of the cost "
        "on a CPU (null: every parameter trains)",
    )


class ActorConfig(TrainedModelConfig):
    """The policy: the model of ``model.path``, trained with PPO."""

    lora: LoRAConfig = Field(default_factory=LoRAConfig)

    @model_validator(mode="after")
    def _one_way_to_train_part(self) -> "ActorConfig":
        if self.train_layers is not None and self.lora.rank > 0:
            raise ValueError(
                "actor.train_layers and actor.lora.rank > 0 are two ways to train part of the model: "
                "choose one (train_layers: null, or lora.rank: 0)"
            )
        return self


class CriticConfig(TrainedModelConfig):
    """The critic: a separate copy of the actor's backbone with a scalar value head."""

    lr: float = Field(1e-5, gt=0)


class AdvantageConfig(_Section):
    """The settings advantage estimators read (``verlog.algo.estimators``' ``AdvantageSettings``
    less the estimator's name): the embedded trainer's ``algorithm:`` block and verl's
    ``verlog.advantage`` share them, with the same meanings and defaults."""

    gamma_step: float = Field(0.99, ge=0, le=1)
    lam_step: float = Field(0.95, ge=0, le=1)
    gamma_token: float = Field(1.0, ge=0, le=1)
    lam_token: float = Field(1.0, ge=0, le=1)
    whiten_advantages: bool | None = Field(
        None,
        description="whiten the estimator's advantages over the batch (mean 0, std 1); null: as its paper "
        "does (gae: yes; grpo, rloo, gigpo: no, group scale kept; reinforce_pp/_baseline normalize in their formula)",
    )
    group_norm: Literal["mean_std", "mean"] | None = Field(
        None,
        description="grpo/gigpo: divide group-centred returns by the group's std (mean_std) or not (mean); "
        "null: each paper's default (grpo: mean_std, gigpo: mean)",
    )
    gigpo_step_weight: float = Field(1.0, ge=0, description="gigpo: weight omega of the step-level advantage")
    gigpo_gamma: float = Field(0.95, ge=0, le=1, description="gigpo: discount of the step returns")
    drop_uniform_groups: bool = Field(
        False,
        description="DAPO's dynamic sampling: groups whose episodes all have the same return leave the "
        "policy loss (group estimators; dropped, not refilled: fixed-turn batches)",
    )
    bootstrap_cuts: bool = Field(
        True,
        description="gae: a turn whose episode goes on past the batch (or was cut by a time limit) "
        "bootstraps from the critic's value of the next state; false treats it as terminated (value 0), as Verlog "
        "does at time limits: an ablation, see docs/long_horizon.md",
    )


class AlgorithmConfig(AdvantageConfig):
    """Advantages and PPO losses. The defaults are Verlog's (github.com/WentseChen/Verlog, for
    3B instruct models): dual-discount GAE with gamma_step 0.99, lam_step 0.95, gamma_token =
    lam_token = 1 (the recursion is written out in ``verlog/algo/multiturn_gae.py``), whitened advantages,
    clip 0.2, dual-clip 3.0, value clip 0.5, a turn's first value weighted x3, entropy 0.001,
    KL-in-reward 0.001, one PPO epoch."""

    estimator: str = Field(
        "gae",
        description="advantage estimator, one of verlog.algo.estimators' registry: gae (dual-discount "
        "GAE with the critic), grpo, gigpo, rloo, reinforce_pp, reinforce_pp_baseline (no critic), zero (advantages zeroed: a control "
        "that must not learn); see docs/algorithms.md",
    )
    ppo_epochs: int = Field(1, ge=1)
    mini_batch_turns: int = Field(256, ge=1, description="turns per optimizer step")
    micro_batch_tokens: int = Field(16384, ge=1, description="token budget of one forward/backward pass")
    shared_prefix_min_tokens: int = Field(
        32,
        ge=0,
        description="rows of a forward pass whose sequences share at least this many leading "
        "tokens compute them once (0: off)",
    )
    clip_eps: float = Field(
        0.2, gt=0, lt=1, description="ratio clip below 1 (eps_low; also above 1 unless clip_eps_high)"
    )
    clip_eps_high: float | None = Field(
        None, gt=0, description="ratio clip above 1 (DAPO's clip-higher, e.g. 0.28; null: clip_eps)"
    )
    dual_clip: float | None = Field(3.0, gt=1, description="dual-clip constant c (null: plain PPO)")
    policy_loss: str = Field(
        "ppo",
        description="policy loss, one of verlog.algo.loss_registry's: ppo (per-token ratio), gspo (one ratio "
        "per turn, GSPO; clip ranges ~3e-4/4e-4), or one a package registers",
    )
    loss_aggregation: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean",
        description="token_mean: every token weighs the same (DAPO); sequence_mean: per turn first (GRPO, GSPO)",
    )
    value_clip: float | None = Field(0.5, gt=0, description="value-loss clip (null: off)")
    first_value_weight: float = Field(3.0, gt=0, description="weight of a turn's V(s_k) in the value loss")
    value_loss_coef: float = Field(1.0, gt=0)
    entropy_coef: float = Field(0.001, ge=0)
    kl_coef: float = Field(0.001, ge=0, description="KL-in-reward to the frozen reference policy (0: no reference)")
    recompute_logprobs: bool = Field(
        True,
        description="old logprobs from a training forward pass (else the engine's own, drawn at each turn's temperature)",
    )
    constrained_logprobs: Literal["masked", "policy"] = Field(
        "masked",
        description="constrained turns (structured output, a forced tool call, a regex): masked = every logprob, "
        "ratio, entropy and KL under the grammar's token masks, the distribution the engine sampled from; "
        "policy = the model's whole distribution",
    )

    @field_validator("estimator")
    @classmethod
    def _check_estimator(cls, value: str) -> str:
        from verlog.algo.estimators.registry import ESTIMATORS  # torch-free: lists the registry's files

        return _registered(value, ESTIMATORS)

    @field_validator("policy_loss")
    @classmethod
    def _check_policy_loss(cls, value: str) -> str:
        from verlog.algo.loss_registry import POLICY_LOSSES  # torch-free

        return _registered(value, POLICY_LOSSES)


def _registered(value: str, registry: Registry[Any]) -> str:
    """``value`` if ``registry`` has a plug-in of that name (without importing it), else the
    ``ValueError`` naming the registered ones."""
    names = registry.names()
    if value not in names:
        raise ValueError(f"must be one of {', '.join(names)}")
    return value


class CriticWarmupConfig(_Section):
    """Critic pre-training: collect ``buffer_multiplier`` batches once, then ``iterations``
    critic-only updates on random ``subset_fraction``s of them (values and GAE recomputed)."""

    buffer_multiplier: int = Field(0, ge=0, description="batches collected for the warm-up (0: off)")
    iterations: int = Field(0, ge=0)
    subset_fraction: float = Field(0.25, gt=0, le=1)
