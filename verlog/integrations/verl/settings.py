"""What verlog reads from a verl config: the ``verlog:`` block and the agent's ``multi_turn`` block.

A verl run of a verlog graph is configured by verl's own hydra config plus two verlog parts:

* ``actor_rollout_ref.rollout.multi_turn.langgraph`` (+ ``chat_template_kwargs``): the graph,
  exactly the ``multi_turn`` block of a verlog config (``verlog.config.MultiTurnConfig``);
* ``verlog:`` (a top-level key): fixed-turn batching, seeds and slot groups, the advantage
  estimator's settings and the critic pre-training schedule (``VerlSettings``).

The estimator itself is verl's key, ``algorithm.adv_estimator``, naming one of verlog's registry
(``verlog.algo.estimators``: gae, grpo, gigpo, rloo, reinforce_pp, reinforce_pp_baseline, zero).

Both are validated here with errors that name the bad key by its full dotted path. Nothing in
this module imports verl: the agent loop, the trainer and the launcher all read their settings
through ``agent_spec(config)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from verlog.config import (
    DEFAULT_EVAL_EPISODES,
    SPLITS,
    VERL_DATA_FILES,
    VERL_PROMPT_KEY,
    AdvantageConfig,
    ConfigError,
    CriticWarmupConfig,
    DataConfig,
    EvalConfig,
    MultiTurnConfig,
    RewardConfig,
    RolloutConfig,
    SlotThreads,
    TrainerConfig,
    VerlRewardFunctionConfig,
    describe_errors,
    verl_data_keys,
)

__all__ = [
    "AGENT_NAME",
    "ESTIMATOR_KEY",
    "TRAINER_NAME",
    "AgentSpec",
    "adopt_verl_keys",
    "EstimatorSettings",
    "VerlAdvantageConfig",
    "VerlSettings",
    "agent_spec",
    "plain",
]

#: the agent loop's name in verl's registry (``agent_name`` of verlog's dataset rows)
AGENT_NAME = "verlog_langgraph"
#: the trainer's name in verl's registry (``trainer.v1.trainer_mode``)
TRAINER_NAME = "verlog"

#: where the agent's block sits in a verl config
MULTI_TURN_KEY = "actor_rollout_ref.rollout.multi_turn"
#: the keys of that block verlog owns (the others are verl's own)
MULTI_TURN_OWN_KEYS = ("langgraph", "chat_template_kwargs")
#: the verl key naming the advantage estimator (one of verlog's registry under this trainer)
ESTIMATOR_KEY = "algorithm.adv_estimator"
#: verl's names of estimators verlog has under another name
VERL_ESTIMATOR_NAMES = {
    "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp_baseline",
    "grpo_vectorized": "grpo",
    "rloo_vectorized": "rloo",
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VerlAdvantageConfig(AdvantageConfig):
    """The advantage estimator's settings (``verlog.advantage``): the keys of the embedded
    trainer's ``algorithm:`` block that estimators read, with the same meaning and defaults
    (``lam_token`` must stay 1 under verl with a critic: ``check_verl_config``)."""


class EstimatorSettings(VerlAdvantageConfig):
    """``verlog.advantage`` plus the estimator's name (``algorithm.adv_estimator``): what
    ``verlog.algo.estimators.estimate_advantages`` reads (its ``AdvantageSettings``)."""

    estimator: str = "gae"


def _default(section: type[BaseModel], name: str) -> Any:
    """The default of ``section.name`` in a verlog config: the verl path's settings of the same
    meaning take it from there (one home for each default)."""
    return section.model_fields[name].default


class VerlSettings(_Section):
    """The ``verlog:`` block of a verl config (defaults: Verlog's BabyAI recipe, those of a verlog
    config's ``trainer``, ``rollout`` and ``eval`` sections)."""

    num_envs: int = Field(
        _default(TrainerConfig, "num_envs"), ge=1, description="persistent env slots (= data.train_batch_size)"
    )
    turns_per_env: int | None = Field(
        _default(TrainerConfig, "turns_per_env"),
        ge=1,
        description="turns each slot gives to every batch; null: one whole episode per sample",
    )
    seed: int = Field(
        _default(RolloutConfig, "seed"),
        description="slot i's j-th episode plays seed + j * G + (g + j) % G: g = i // group_size its group, "
        "G = num_envs * rollout.n / group_size the number of groups",
    )
    group_size: int = Field(
        _default(TrainerConfig, "group_size"),
        ge=1,
        description="consecutive slots (num_envs * rollout.n in all) playing the same seeds: the groups "
        "grpo, rloo and gigpo compare (default: actor_rollout_ref.rollout.n, verl's group: a row's sessions)",
    )
    episode_timeout_s: float | None = Field(
        _default(RolloutConfig, "episode_timeout_s"),
        gt=0,
        description="per episode: time in the graph's own code (model calls, queued, generating or held at a batch "
        "boundary, never count)",
    )
    max_consecutive_failures: int = Field(
        _default(TrainerConfig, "max_consecutive_failures"),
        ge=1,
        description="a slot failing this often in a row fails its verl sample",
    )
    slot_threads: SlotThreads = Field(
        _default(RolloutConfig, "slot_threads"),
        description="where a session's episodes run: auto, on the agent-loop worker's event loop until a graph "
        "makes a blocking model call in an async def node (then on a thread per session); always, a thread per "
        "session (rollout.slot_threads of a verlog config)",
    )
    eval_episodes: int = Field(DEFAULT_EVAL_EPISODES, ge=1, description="validation episodes (verl's val set)")
    eval_seed: int = Field(_default(EvalConfig, "seed"), description="seed of the first validation episode")
    advantage: VerlAdvantageConfig = Field(default_factory=VerlAdvantageConfig)
    critic_warmup: CriticWarmupConfig = Field(default_factory=CriticWarmupConfig)
    data: DataConfig | None = Field(
        None,
        description="task rows instead of make_input(seed): slots play data.train in shuffled epochs, "
        "validation plays data.validation (the data section of a verlog config)",
    )
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="reward functions and rubric judges run on each finished "
        "episode in the agent loop (the reward section of a verlog config)",
    )

    @model_validator(mode="after")
    def _check_sources(self) -> "VerlSettings":
        if self.data is not None and self.data.traces is not None:
            raise ValueError(
                "data.traces: training on recorded episodes runs on the embedded trainer (verlog train); "
                "the verl path plays live slots only: remove data.traces here"
            )
        if self.data is not None and self.data.train is None:
            raise ValueError("data.train: the slots play the training split's rows; give its file")
        for i, judge in enumerate(self.reward.judges):
            if judge.kind == "ranking":
                raise ValueError(
                    f"reward.judges[{i}]: a ranking judge scores the groups of a batch, which the embedded trainer "
                    "collects; under verl each agent loop ends its own episodes: use a rubric judge or a function"
                )
            if judge.embedded not in (None, "policy"):
                raise ValueError(
                    f"reward.judges[{i}].embedded: under verl a judge is an endpoint or the policy's own server "
                    f"(embedded: policy), not a model loaded in every agent-loop worker ({judge.embedded!r})"
                )
        return self

    def validation_episodes(self) -> int:
        """Validation episodes: every row of ``data.validation`` (at most ``eval_episodes`` when it
        was set), else ``eval_episodes`` seeds."""
        if self.data is None or self.data.validation is None:
            return self.eval_episodes
        from verlog.data import split_rows

        rows = len(split_rows(self, "validation"))
        return min(rows, self.eval_episodes) if "eval_episodes" in self.model_fields_set else rows


@dataclass(frozen=True)
class AgentSpec:
    """Everything verlog needs from a verl config to run and train a graph."""

    multi_turn: MultiTurnConfig
    settings: VerlSettings
    model_path: str
    #: verl's rollout.n: sessions per dataset row (each is its own env slot)
    rollout_n: int
    #: verl's rollout.prompt_length / response_length: the longest prompt and response a turn may have
    prompt_length: int
    response_length: int
    #: verl's rollout.temperature: the one temperature verl's trainer scores every row at
    rollout_temperature: float = 1.0
    #: verl's rollout.name: the inference server (``sglang``, ``vllm``...)
    rollout_name: str = "sglang"
    #: ``algorithm.adv_estimator``: the estimator of verlog's registry that computes the advantages
    estimator: str = "gae"

    @property
    def num_slots(self) -> int:
        """Env slots in all: ``num_envs`` dataset rows x ``rollout.n`` sessions each."""
        return self.settings.num_envs * max(1, self.rollout_n)

    @property
    def num_groups(self) -> int:
        """Slot groups (``group_size`` consecutive slots each, playing the same seeds)."""
        return self.num_slots // self.settings.group_size

    def advantage_settings(self) -> EstimatorSettings:
        """What the estimator registry reads: ``verlog.advantage`` and the estimator's name."""
        return EstimatorSettings(estimator=self.estimator, **self.settings.advantage.model_dump())


def plain(node: Any) -> Any:
    """An OmegaConf node (or anything) as plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        return node
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _select(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        getter = getattr(node, "get", None)
        node = getter(part, None) if getter is not None else getattr(node, part, None)
    return default if node is None else node


def _validate(model: type[BaseModel], data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        lines = [f"  {prefix}.{line.strip()}" for line in describe_errors(exc, model).splitlines()]
        raise ConfigError("invalid verl config:\n" + "\n".join(lines)) from None


def read_multi_turn(config: Any) -> MultiTurnConfig:
    """The agent's ``multi_turn`` block (verlog's keys of ``actor_rollout_ref.rollout.multi_turn``)."""
    block = plain(_select(config, MULTI_TURN_KEY)) or {}
    own = {k: block[k] for k in MULTI_TURN_OWN_KEYS if block.get(k) is not None}
    if "langgraph" not in own:
        raise ConfigError(
            f"{MULTI_TURN_KEY}.langgraph is missing: it names the graph to train, e.g. "
            "{path: graphs/babyai.py, graph_config: {recursion_limit: 400}}"
        )
    return _validate(MultiTurnConfig, own, MULTI_TURN_KEY)


def read_settings(config: Any) -> VerlSettings:
    """The ``verlog:`` block of a verl config (defaults where it is absent)."""
    block = plain(_select(config, "verlog"))
    if isinstance(block, Mapping) and "gae" in block:
        raise ConfigError("verlog.gae is now verlog.advantage: the settings of every estimator, GAE's included")
    return _validate(VerlSettings, block, "verlog")


def read_estimator(config: Any) -> str:
    """``algorithm.adv_estimator``, checked against verlog's estimator registry (torch-free)."""
    from verlog.algo.estimators.registry import estimator_names

    name = str(_select(config, ESTIMATOR_KEY, "gae"))
    if name not in estimator_names():
        hint = f" (verlog's name for it: {VERL_ESTIMATOR_NAMES[name]})" if name in VERL_ESTIMATOR_NAMES else ""
        raise ConfigError(
            f"{ESTIMATOR_KEY}={name!r}{hint}: trainer.v1.trainer_mode={TRAINER_NAME} computes advantages with "
            f"verlog's estimators, one of: {', '.join(estimator_names())} (verl's own estimators score one reward "
            "per sample and do not fit per-turn rows; see docs/verl.md)"
        )
    return name


def agent_spec(config: Any) -> AgentSpec:
    """Read and validate verlog's parts of a (composed) verl config."""
    multi_turn = read_multi_turn(config)
    model_path = _select(config, "actor_rollout_ref.model.path")
    if not model_path:
        raise ConfigError("actor_rollout_ref.model.path is missing: the policy model's folder")
    rollout = _select(config, "actor_rollout_ref.rollout")
    settings = read_settings(config)
    rollout_n = int(_select(rollout, "n", 1))
    if "group_size" not in settings.model_fields_set and rollout_n > 1:
        # verl's GRPO group is a prompt's rollout.n responses: a row's sessions, consecutive slots
        settings.group_size = rollout_n
    spec = AgentSpec(
        multi_turn=multi_turn,
        settings=settings,
        model_path=str(model_path),
        rollout_n=rollout_n,
        prompt_length=int(_select(rollout, "prompt_length", 512)),
        response_length=int(_select(rollout, "response_length", 512)),
        rollout_temperature=float(_select(rollout, "temperature", 1.0)),
        rollout_name=str(_select(rollout, "name", "sglang")),
        estimator=read_estimator(config),
    )
    if spec.num_slots % spec.settings.group_size:
        raise ConfigError(
            f"verlog.group_size ({spec.settings.group_size}) must divide the env slots, verlog.num_envs x "
            f"actor_rollout_ref.rollout.n = {spec.settings.num_envs} x {max(1, spec.rollout_n)} = {spec.num_slots}"
        )
    return spec


#: where verl's configs put the custom reward function (the older top-level key, and ``reward``'s)
VERL_REWARD_FUNCTION_KEYS = ("custom_reward_function", "reward.custom_reward_function")


def adopt_verl_keys(data: dict[str, Any]) -> list[str]:
    """Move the keys a verl user sets for data and rewards into the ``verlog:`` block, in place,
    and return one note per key moved (the launcher prints them).

    verl's ``data.train_files`` / ``val_files`` / ``prompt_key`` become ``verlog.data.train`` /
    ``validation`` / ``input.prompt`` (verl's own ``data.*_files`` then name verlog's slot rows,
    which play the user's rows); ``custom_reward_function: {path, name, reward_kwargs}`` (at the
    top level or in ``reward``) becomes an entry of ``verlog.reward.functions`` (verl's key is
    left at its default: the agent loop scores each episode, verl's reward manager does not).
    A key given both ways is refused (``ConfigError``) rather than one silently winning."""
    block = data.get("verlog")
    if block is None:
        block = data["verlog"] = {}
    if not isinstance(block, dict):
        raise ConfigError(f"verlog must be a mapping, got {type(block).__name__}")
    notes: list[str] = []
    verl_data = data.get("data")
    if isinstance(verl_data, dict):
        moved = {k: verl_data.pop(k) for k in (*VERL_DATA_FILES, VERL_PROMPT_KEY) if k in verl_data}
        moved = {k: v for k, v in moved.items() if v is not None}
        if moved:
            own = dict(block.get("data") or {})
            for verl_key, split in VERL_DATA_FILES.items():
                if verl_key in moved and own.get(split) is not None:
                    raise ConfigError(f"data.{verl_key} and verlog.data.{split} both name the {split} rows: keep one")
            if VERL_PROMPT_KEY in moved and "prompt" in (own.get("input") or {}):
                raise ConfigError(
                    f"data.{VERL_PROMPT_KEY} and verlog.data.input.prompt both name the prompt column: keep one"
                )
            try:
                block["data"] = {**own, **verl_data_keys(moved)}
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            notes += [
                f"data.{k} is played as verlog.data.{VERL_DATA_FILES.get(k, 'input.prompt')} (verl's "
                f"data.{k} names verlog's slot rows)"
                for k in moved
            ]
    if isinstance(verl_data, dict) and verl_data.get("train_batch_size") is not None and "num_envs" not in block:
        block["num_envs"] = verl_data.pop("train_batch_size")
        notes.append(
            f"data.train_batch_size is verlog.num_envs ({block['num_envs']}): the rows (env slots) of a "
            "batch, each played by actor_rollout_ref.rollout.n sessions"
        )
    rollout = (
        (data.get("actor_rollout_ref") or {}).get("rollout")
        if isinstance(data.get("actor_rollout_ref"), dict)
        else None
    )
    multi_turn = rollout.get("multi_turn") if isinstance(rollout, dict) else None
    for key in sorted(multi_turn or {}):
        if key not in (*MULTI_TURN_OWN_KEYS, "enable", "_target_"):
            notes.append(
                f"{MULTI_TURN_KEY}.{key} is a setting of verl's own tool agent, unused here: verlog's agent "
                "is the graph (its tools and turn limit: langgraph.graph_kwargs / graph_config.recursion_limit)"
            )
    for dotted in VERL_REWARD_FUNCTION_KEYS:
        parent = data
        *path, last = dotted.split(".")
        for part in path:
            parent = parent.get(part) if isinstance(parent, dict) else None
        entry = parent.get(last) if isinstance(parent, dict) else None
        if not isinstance(entry, dict) or not entry.get("path"):
            continue
        parent.pop(last)
        try:
            function = VerlRewardFunctionConfig.model_validate(entry).as_function()
        except ValidationError as exc:
            lines = [
                f"  {dotted}.{line.strip()}" for line in describe_errors(exc, VerlRewardFunctionConfig).splitlines()
            ]
            raise ConfigError("invalid verl config:\n" + "\n".join(lines)) from None
        reward = dict(block.get("reward") or {})
        reward["functions"] = [*(reward.get("functions") or []), function.model_dump(exclude_defaults=True)]
        block["reward"] = reward
        notes.append(
            f"{dotted} ({function.function}) runs as verlog.reward.functions[{len(reward['functions']) - 1}] "
            "in the agent loop"
        )
    return notes


def resolve_source_paths(block: Any, *bases: Path) -> None:
    """Make the file paths of a ``verlog:`` block's ``data`` splits and ``reward.functions``
    absolute, in place (as ``resolve_graph_path``: Ray workers may run elsewhere)."""
    if not isinstance(block, dict):
        return
    data = block.get("data")
    if isinstance(data, dict):
        for split in SPLITS:
            source = data.get(split)
            if isinstance(source, str):
                data[split] = resolve_graph_path(source, *bases)
            elif isinstance(source, dict) and isinstance(source.get("path"), str):
                source["path"] = resolve_graph_path(source["path"], *bases)
    functions = (block.get("reward") or {}).get("functions") if isinstance(block.get("reward"), dict) else None
    for i, entry in enumerate(functions or []):
        target = entry if isinstance(entry, str) else entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(target, str) or ":" not in target:
            continue
        module, _, name = target.rpartition(":")
        if module.endswith(".py"):
            resolved = f"{resolve_graph_path(module, *bases)}:{name}"
            if isinstance(entry, str):
                functions[i] = resolved
            else:
                entry["function"] = resolved


def resolve_graph_path(path: str, *bases: Path) -> str:
    """A graph path made absolute: as given if it exists, else relative to ``bases`` in order
    (Ray workers may run in another working directory, so launchers store absolute paths)."""
    candidate = Path(path)
    if candidate.is_absolute():
        return str(candidate)
    if candidate.exists():
        return str(candidate.resolve())
    for base in bases:
        if (base / candidate).exists():
            return str((base / candidate).resolve())
    return str(candidate.resolve())
