"""verlog's YAML configuration: typed sections, strict validation, errors that name the key.

Every section rejects unknown keys; a bad value is reported with its dotted key, what was given
and what is allowed. ``load_config(path, overrides)`` applies ``key.path=value`` overrides (the
value parsed as YAML) before validating.

The agent is chosen by the ``multi_turn`` block::

    multi_turn:
      chat_template_kwargs: {enable_thinking: false}
      langgraph:
        path: graphs/calculator.py
        graph_config: {recursion_limit: 50}

The modules, by job: ``base`` (what every section shares), the sections of ``agent`` (graph file,
model, engine, sampling, rollout), ``data``, ``rewards``, ``training`` (trainer, actor, critic,
algorithm, critic warm-up) and ``evaluation``, the whole config (``root``), ``overrides``
(``key.path=value``) and ``loading`` (a YAML file into a validated config).
"""

from verlog.config.agent import (
    RUN_CONFIG_KEYS,
    EngineConfig,
    LangGraphConfig,
    ModelConfig,
    MultiTurnConfig,
    RolloutConfig,
    SamplingConfig,
    SGLangConfig,
)
from verlog.config.base import (
    DEFAULT_MAX_RESUMES,
    REWARD_MAX_ABS,
    SLOT_THREADS,
    VERL_REWARD_FUNCTION_NAME,
    ConfigError,
    SlotThreads,
    json_object,
)
from verlog.config.data import (
    DATA_FORMATS,
    EVAL_SPLITS,
    SPLITS,
    VERL_DATA_FILES,
    VERL_PROMPT_KEY,
    DataConfig,
    DataInputConfig,
    DataSourceConfig,
    EvalSplitName,
    SplitName,
    StalenessConfig,
    TracesConfig,
    verl_data_keys,
)
from verlog.config.evaluation import DEFAULT_EVAL_EPISODES, EvalConfig, EvalTaskConfig
from verlog.config.loading import config_from_dict, describe_errors, load_config, read_yaml_mapping, resolve_path
from verlog.config.overrides import apply_overrides, parse_overrides
from verlog.config.rewards import (
    EpisodeSources,
    JudgeConfig,
    JudgeEndpointConfig,
    RewardConfig,
    RewardFunctionConfig,
    VerlRewardFunctionConfig,
)
from verlog.config.root import VerlogConfig, WandbConfig
from verlog.config.sft import DEMONSTRATION_SOURCES, DemonstrationsConfig, SftConfig
from verlog.config.training import (
    ActorConfig,
    AdvantageConfig,
    AlgorithmConfig,
    CriticConfig,
    CriticWarmupConfig,
    LoRAConfig,
    OptimConfig,
    OverlapConfig,
    StragglerConfig,
    TrainedModelConfig,
    TrainerConfig,
)

__all__ = [
    "DEMONSTRATION_SOURCES",
    "DemonstrationsConfig",
    "SftConfig",
    "describe_errors",
    "ActorConfig",
    "AdvantageConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "CriticWarmupConfig",
    "DATA_FORMATS",
    "DEFAULT_EVAL_EPISODES",
    "DEFAULT_MAX_RESUMES",
    "SLOT_THREADS",
    "SlotThreads",
    "DataConfig",
    "DataInputConfig",
    "DataSourceConfig",
    "EVAL_SPLITS",
    "EngineConfig",
    "EpisodeSources",
    "EvalConfig",
    "EvalSplitName",
    "EvalTaskConfig",
    "JudgeConfig",
    "JudgeEndpointConfig",
    "LangGraphConfig",
    "LoRAConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlapConfig",
    "REWARD_MAX_ABS",
    "RUN_CONFIG_KEYS",
    "RewardConfig",
    "RewardFunctionConfig",
    "RolloutConfig",
    "SGLangConfig",
    "SPLITS",
    "SamplingConfig",
    "SplitName",
    "StalenessConfig",
    "StragglerConfig",
    "TracesConfig",
    "TrainedModelConfig",
    "TrainerConfig",
    "VERL_DATA_FILES",
    "VERL_PROMPT_KEY",
    "VERL_REWARD_FUNCTION_NAME",
    "VerlRewardFunctionConfig",
    "VerlogConfig",
    "WandbConfig",
    "apply_overrides",
    "config_from_dict",
    "json_object",
    "load_config",
    "parse_overrides",
    "read_yaml_mapping",
    "resolve_path",
    "verl_data_keys",
]
