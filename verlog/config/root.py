"""``VerlogConfig``: a whole verlog config, every section together (and ``wandb``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from verlog.config.agent import EngineConfig, ModelConfig, MultiTurnConfig, RolloutConfig, SamplingConfig
from verlog.config.base import _Section
from verlog.config.data import DataConfig
from verlog.config.evaluation import EvalConfig
from verlog.config.rewards import RewardConfig
from verlog.config.sft import SftConfig
from verlog.config.training import ActorConfig, AlgorithmConfig, CriticConfig, CriticWarmupConfig, TrainerConfig

if TYPE_CHECKING:
    pass


class WandbConfig(_Section):
    """Weights & Biases logging (offline by default; files under ``trainer.run_dir``)."""

    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "verlog"
    name: str | None = None
    tags: list[str] = Field(default_factory=list)


class VerlogConfig(_Section):
    """The whole configuration file."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig
    data: DataConfig | None = None
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic_warmup: CriticWarmupConfig = Field(default_factory=CriticWarmupConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    #: the supervised warm start (``verlog sft``); ``None``: the config has none
    sft: SftConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _verl_top_level_reward_function(cls, data: Any) -> Any:
        """verl's older configs put ``custom_reward_function`` at the top level: it moves into
        ``reward`` (as verl's own migration does)."""
        if isinstance(data, dict) and "custom_reward_function" in data:
            data = dict(data)
            block = data.pop("custom_reward_function")
            if block is not None:
                reward = dict(data.get("reward") or {})
                if reward.get("custom_reward_function") is not None:
                    raise ValueError("custom_reward_function is given twice, at the top level and in reward: keep one")
                reward["custom_reward_function"] = block
                data["reward"] = reward
        return data
