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
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    from verlog.registry import Registry


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names every bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object (command-line flags, environment variables); a
    ``ValueError`` naming ``what`` when it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {text!r}")
    return value


def _keyword_mapping(value: Any, what: str, example: str) -> dict[str, Any]:
    """``value`` as keyword arguments: a mapping whose keys are Python identifiers."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of {what}, e.g. {example}")
    bad = [k for k in value if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise ValueError(f"keys must be argument names ({what}); not {', '.join(repr(k) for k in bad)}")
    return value


#: the function verl's ``custom_reward_function`` names when its ``name`` is not given
VERL_REWARD_FUNCTION_NAME = "compute_score"
#: the largest reward magnitude taken as a training signal (a reward is on the scale of an episode's
#: return; one of 1e300 would swamp every advantage it is whitened with): without ``reward.clip``, a
#: reward component beyond +-this fails its episode (``reward.max_abs``'s default), and feedback
#: beyond it is refused (``verlog.traces.records.check_reward``)
REWARD_MAX_ABS = 1e6

#: the most ``interrupt()`` pauses one episode's responder answers (``multi_turn.langgraph.max_resumes``)
DEFAULT_MAX_RESUMES = 16


def _check_function_target(value: str) -> str:
    """``file.py:function`` or ``package.module:function`` (a ``ValueError`` otherwise)."""
    target, sep, name = value.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError("must be file.py:function or package.module:function, e.g. rewards.py:correct")
    return value


#: keys of LangChain's RunnableConfig that a graph run accepts
RUN_CONFIG_KEYS = ("recursion_limit", "configurable", "tags", "metadata", "max_concurrency", "run_name")


class LangGraphConfig(_Section):
    """Which graph file to run and how."""

    path: str = Field(description="a graphs/*.py file exposing build_graph(model, **graph_kwargs)")
    graph_config: dict[str, Any] = Field(
        default_factory=dict,
        description=f"the run config of each episode; keys: {', '.join(RUN_CONFIG_KEYS)}; without a "
        "recursion_limit, the graph's own (verlog's game graphs carry their longest episode's), else 100",
    )
    graph_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of build_graph")
    on_interrupt: str | None = Field(
        None,
        description="file.py:function answering the graph's interrupt() pauses in training, rollout and "
        "evaluation: function(value, state) -> the Command(resume=...) value; without it a paused episode "
        "ends 'interrupted' (never trained, left out of scores)",
    )
    max_resumes: int = Field(
        DEFAULT_MAX_RESUMES,
        ge=1,
        description="the most interrupt() pauses on_interrupt answers in one episode; "
        "still paused after that, it ends 'interrupted'",
    )
    train_discarded_calls: bool = Field(
        False,
        description="also train the model calls made in a node attempt that then raised (a RetryPolicy "
        "retry, with_retry, with_fallbacks): by default they are left out (counted in discarded_calls)",
    )

    @field_validator("on_interrupt")
    @classmethod
    def _check_on_interrupt(cls, value: str | None) -> str | None:
        return None if value is None else _check_function_target(value)

    @field_validator("graph_kwargs", mode="before")
    @classmethod
    def _check_graph_kwargs(cls, value: Any) -> dict[str, Any]:
        return _keyword_mapping(value, "keyword arguments of build_graph", "{max_steps: 64}")

    @field_validator("graph_config", mode="before")
    @classmethod
    def _check_run_config_type(cls, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("must be a mapping (a run config), e.g. {recursion_limit: 50}")
        return value

    @field_validator("graph_config")
    @classmethod
    def _check_run_config(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(RUN_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"unknown run-config key(s) {unknown}; allowed: {', '.join(RUN_CONFIG_KEYS)}")
        limit = value.get("recursion_limit", 1)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"recursion_limit must be an integer >= 1, got {limit!r}")
        return value


class MultiTurnConfig(_Section):
    """The agent: a LangGraph graph plus chat-template options (also accepted by verl configs)."""

    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    langgraph: LangGraphConfig

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _check_template_kwargs(cls, value: Any) -> dict[str, Any]:
        return _keyword_mapping(value, "keyword arguments of the chat template", "{enable_thinking: false}")


class ModelConfig(_Section):
    """The policy model: ``tiny`` (random-init test model), ``smollm2``, a local HF folder, a verlog
    run or checkpoint folder (its latest actor) or a Hugging Face hub id (from the local cache)."""

    path: str = Field(
        "tiny",
        description="tiny, toy, babyai-words, crafter-words, sokoban-words, smollm2; a local Hugging Face model folder; a verlog run or "
        "checkpoint folder (its latest actor); or a hub id org/name (the local Hugging Face cache, or a download "
        "unless HF_HUB_OFFLINE)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="the weights' dtype; training keeps float32 master weights (and refuses others)"
    )
    autocast: Literal["none", "bfloat16", "float16"] = Field(
        "none",
        description="compute dtype of forward passes (torch.autocast): training passes and the embedded "
        "engine; float16 training scales the loss (GradScaler)",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not value.startswith("cuda:"):
            raise ValueError(f"device must be one of auto, cpu, cuda, cuda:N; got {value!r}")
        return value


class SGLangConfig(_Section):
    """Where a running SGLang server listens and how patient to be with it."""

    url: str = "http://127.0.0.1:30000"
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)


class EngineConfig(_Section):
    """Which inference engine produces the tokens."""

    kind: Literal["embedded", "sglang"] = "embedded"
    max_batch_size: int = Field(64, ge=1, description="embedded: most requests decoded together")
    batch_wait_ms: float = Field(2.0, ge=0, description="embedded: wait for more requests to join a batch")
    prefix_cache_mb: float = Field(
        512.0, ge=0, le=1 << 20, description="embedded: MiB of prompt KV kept across calls (0: off)"
    )
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)


class SamplingConfig(_Section):
    """Default sampling settings of the chat model (nodes may override per call)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)


class RolloutConfig(_Section):
    """How many episodes ``verlog rollout`` runs, how many at once, and their time limit."""

    episodes: int = Field(4, ge=1)
    concurrency: int = Field(32, ge=1)
    episode_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="the most seconds an episode's graph may spend in its own code (time in model calls, "
        "queued or generating, never counts: a busy machine times nothing out); an episode past it fails (training: "
        "not trained; evaluation: an error played again, never a loss). null: no limit (recursion_limit bounds the "
        "work)",
    )
    seed: int = 0


#: the roles a data split plays: training rows, periodic validation, the final evaluation
SplitName = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = get_args(SplitName)
#: the splits an evaluation may play (never the training rows)
EvalSplitName = Literal["validation", "test"]
EVAL_SPLITS: tuple[str, ...] = get_args(EvalSplitName)
#: file formats a split may be read from (``auto``: by the path's suffix; a folder is ``disk``)
DATA_FORMATS = ("auto", "json", "parquet", "csv", "disk")


class DataSourceConfig(_Section):
    """One split's rows: a JSONL/JSON, Parquet or CSV file (or a glob of them), or a Hugging Face
    ``datasets`` folder written by ``save_to_disk``. Read with the ``datasets`` library."""

    path: str = Field(description="a file, a glob of files, or a datasets folder (save_to_disk)")
    format: Literal["auto", "json", "parquet", "csv", "disk"] = Field(
        "auto",
        description="json (also JSONL), parquet, csv or disk (a save_to_disk folder); auto: by the "
        "suffix (.jsonl/.json, .parquet, .csv; a folder is disk)",
    )
    split: str | None = Field(
        None, description="the split to take from a datasets folder holding several (a DatasetDict)"
    )
    limit: int | None = Field(None, ge=1, description="use only the first N rows")


def _source(value: Any) -> Any:
    return {"path": value} if isinstance(value, str) else value


class DataInputConfig(_Section):
    """How a row becomes the graph's input when the graph file has no ``make_input(row)``: a
    ``messages`` state (what LangGraph's prebuilt agents take) from the ``prompt`` column."""

    prompt: str = Field(
        "prompt",
        description="the column holding the prompt: a string (one user message) or a list of chat "
        "messages ({role, content})",
    )
    system: str | None = Field(None, description="a system message put before the prompt")
    state: dict[str, str] = Field(
        default_factory=dict,
        description="more keys of the input state, each taken from a column, e.g. {target: answer}",
    )


class StalenessConfig(_Section):
    """How turns served by older model versions count when training from traces. A turn's staleness
    is how many updates of the run lie between the checkpoint that served it and the weights being
    trained, by the checkpoint lineage (``verlog.train.trace_batches.lineage_staleness``): 0 for
    turns the trained weights served; a version of a later update than the trainer holds (after a
    rollback) is off its lineage and always dropped."""

    max_versions: int | None = Field(
        None,
        ge=0,
        description="turns served more than this many updates before the trained weights are dropped "
        "(not trained on); null: none are dropped",
    )
    decay: float = Field(
        1.0, gt=0, le=1, description="a turn's weight in the policy loss is decay ** staleness (1: no down-weighting)"
    )


class TracesConfig(_Section):
    """Production traffic as training data: the episodes ``verlog serve-model --record`` stored, with
    the rewards feedback attached (only episodes with feedback are trained). Their turns are scored
    like live ones (values, advantages over each episode's turns) and updated with decoupled PPO
    against the recorded behaviour logprobs (``verlog.algo.off_policy``)."""

    store: str = Field(
        min_length=1, description="the trace store: the folder given to --record, or a postgresql:// URL"
    )
    fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="the share of each batch's slots filled with recorded turns; 1: traces only "
        "(no rollouts), below 1: the other slots play the graph live",
    )
    behaviour_weight_cap: float = Field(
        2.0, ge=1, description="truncation of the importance weight pi_proximal / pi_behaviour of each token"
    )
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)


#: verl's ``data`` keys naming split files -> verlog's splits
VERL_DATA_FILES = {"train_files": "train", "val_files": "validation"}
#: verl's ``data`` key naming the prompt column (verlog's ``data.input.prompt``)
VERL_PROMPT_KEY = "prompt_key"


def verl_data_keys(data: dict[str, Any], where: str = "data") -> dict[str, Any]:
    """A ``data`` mapping with verl's keys (``train_files``, ``val_files``, ``prompt_key``) turned
    into verlog's (``train``, ``validation``, ``input.prompt``); ``ValueError`` when both name
    the same thing or a split has several files (verlog reads one file or glob per split)."""

    def key(name: str) -> str:
        return f"{where}.{name}" if where else name

    data = dict(data)
    for verl_key, split in VERL_DATA_FILES.items():
        if verl_key not in data:
            continue
        files = data.pop(verl_key)
        if isinstance(files, (list, tuple)):
            if len(files) != 1:
                raise ValueError(
                    f"{key(verl_key)}: verlog reads one file, glob or datasets folder per split, got {len(files)} "
                    f"files; give one (a glob such as data/*.parquet for several)"
                )
            files = files[0]
        if data.get(split) is not None:
            raise ValueError(f"{key(verl_key)} and {key(split)} both name the {split} rows: keep one")
        data[split] = os.path.expanduser(str(files)) if isinstance(files, str) else files
    if VERL_PROMPT_KEY in data:
        column = data.pop(VERL_PROMPT_KEY)
        spec = dict(data.get("input") or {})
        if spec.get("prompt") not in (None, column):
            raise ValueError(f"{key(VERL_PROMPT_KEY)} and {key('input.prompt')} name different columns: keep one")
        spec["prompt"] = column
        data["input"] = spec
    return data


class DataConfig(_Section):
    """The task rows episodes play (instead of ``make_input(seed)``): a training split played in
    shuffled epochs, a validation split for the periodic evaluations and a test split for the
    final one (``verlog eval``). Group estimators play each training row ``group_size`` times."""

    train: DataSourceConfig | None = None
    validation: DataSourceConfig | None = None
    test: DataSourceConfig | None = None
    input: DataInputConfig = Field(default_factory=DataInputConfig)
    shuffle: bool = Field(True, description="a new order of the training rows every epoch")
    seed: int = Field(0, description="seed of the epochs' orders")
    traces: TracesConfig | None = Field(
        None,
        description="train on recorded production episodes (verlog serve-model --record), alone or beside "
        "live rollouts; see docs/production_loop.md",
    )

    @model_validator(mode="before")
    @classmethod
    def _verl_keys(cls, value: Any) -> Any:
        """verl's ``train_files``, ``val_files`` and ``prompt_key`` mean ``train``, ``validation``
        and ``input.prompt``."""
        return verl_data_keys(value, where="") if isinstance(value, dict) else value

    @field_validator("train", "validation", "test", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _source(value)

    def split(self, name: str) -> DataSourceConfig | None:
        """The source of split ``name`` (one of ``SPLITS``)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def has_rows(self) -> bool:
        """Whether any split gives task rows (with ``traces`` alone none does: the live slots and
        the evaluations play ``make_input(seed)``)."""
        return any(self.split(name) is not None for name in SPLITS)


class RewardFunctionConfig(_Section):
    """A reward function run once an episode ends: ``path/to/file.py:function`` or
    ``package.module:function``, sync or async (see ``verlog.rewards``)."""

    function: str = Field(description="file.py:function or package.module:function")
    name: str | None = Field(None, description="its name in metrics (default: the function's name)")
    weight: float = Field(1.0, description="its reward is multiplied by this before the rewards are summed")
    timeout_s: float | None = Field(60.0, gt=0, description="longer marks the episode failed (null: no limit)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the function")

    @field_validator("function")
    @classmethod
    def _check_function(cls, value: str) -> str:
        return _check_function_target(value)


class JudgeEndpointConfig(_Section):
    """An OpenAI-compatible chat-completions endpoint (``verlog serve-model``, vLLM, SGLang, OpenAI...)."""

    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="the model name the endpoint serves")
    api_key_env: str | None = Field(None, description="the environment variable holding the API key")


class JudgeConfig(_Section):
    """An LLM judge, run outside the graph (its calls are never training turns).

    ``rubric``: each episode scored on its own against the rubric (0-1). ``ranking``: the episodes
    of one group (one task, ``trainer.group_size`` episodes) scored relative to each other in one
    call, no labels needed (the idea of ART's RULER); it trains only (evaluation has no groups)."""

    kind: Literal["rubric", "ranking"] = "rubric"
    name: str | None = Field(None, description="its name in metrics (default: judge_<kind>)")
    weight: float = 1.0
    endpoint: JudgeEndpointConfig | None = None
    embedded: str | None = Field(
        None,
        description="an embedded model judges instead of an endpoint: policy (the model being trained, "
        "its current weights) or a model path (tiny, smollm2, a folder)",
    )
    rubric: str | None = Field(None, description="what a good episode is (default: a general rubric)")
    reference_column: str | None = Field(None, description="a column of the row shown to the judge as the reference")
    temperature: float = Field(0.0, ge=0, description="the judge's sampling temperature (0: greedy)")
    max_tokens: int = Field(
        1024,
        ge=1,
        description="the most tokens of one verdict; a ranking verdict holds an explanation and a score "
        "per episode of the group (about explanation_chars/4 + 15 tokens each in English)",
    )
    explanation_chars: int = Field(
        240, ge=16, description="the longest explanation the judge may write per episode (its JSON schema caps it)"
    )
    transcript_chars: int = Field(
        12000,
        ge=1000,
        description="each episode's transcript is cut to this many characters for the judge: long "
        "messages keep their start and end, then the oldest turns after the task go first",
    )
    concurrency: int = Field(4, ge=1, description="judge calls at once")
    timeout_s: float = Field(
        120.0,
        gt=0,
        description="per verdict, retries and their waits included (each attempt gets the time left "
        "divided by the attempts left)",
    )
    retries: int = Field(
        2,
        ge=0,
        description="further attempts after a connection error, a timeout, HTTP 5xx or 429 (Retry-After "
        "honoured) or an answer that is not a valid verdict",
    )
    max_consecutive_failures: int = Field(
        10,
        ge=1,
        description="this many verdicts in a row that fail (no valid verdict after the retries, the endpoint "
        "down...) stop the run: a judge answering garbage would otherwise fail every episode",
    )
    cache: bool = Field(
        True,
        description="keep verdicts (in memory, and in the run folder's judges/<name>.jsonl): a verdict "
        "asked twice, e.g. by a resumed run, is paid once (not with embedded: policy, whose weights change)",
    )

    @model_validator(mode="after")
    def _one_model(self) -> "JudgeConfig":
        if (self.endpoint is None) == (self.embedded is None):
            raise ValueError("give exactly one of endpoint ({base_url, model}) and embedded (policy or a model path)")
        return self


class VerlRewardFunctionConfig(_Section):
    """verl's ``custom_reward_function`` block, as verl's docs write it: ``path`` (a Python file),
    ``name`` (its function, verl's default ``compute_score``) and ``reward_kwargs`` (more keyword
    arguments). verlog runs it as one more entry of ``reward.functions``."""

    path: str | None = Field(None, description="the Python file holding the function (null: no custom function)")
    name: str | None = Field(
        VERL_REWARD_FUNCTION_NAME, description=f"the function's name in that file (null: {VERL_REWARD_FUNCTION_NAME})"
    )
    reward_kwargs: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the function")

    def as_function(self) -> RewardFunctionConfig | None:
        """The ``reward.functions`` entry this block means (``None`` without a ``path``)."""
        if not self.path:
            return None
        name = self.name or VERL_REWARD_FUNCTION_NAME
        return RewardFunctionConfig(function=f"{self.path}:{name}", kwargs=dict(self.reward_kwargs))


class RewardConfig(_Section):
    """Rewards computed outside the graph once an episode ends, added to those the graph reports
    itself (``areport_reward``): weighted reward functions and LLM judges.

    verl's ``custom_reward_function: {path, name}`` (here, or at the top level of the config as
    verl's older configs have it) becomes one more entry of ``functions``. ``clip`` bounds each
    component's reward; without it, a value beyond ``max_abs`` fails its episode (a reward of
    1e30 is a bug in the function, not a signal to train on)."""

    functions: list[RewardFunctionConfig] = Field(default_factory=list)
    judges: list[JudgeConfig] = Field(default_factory=list)
    custom_reward_function: VerlRewardFunctionConfig | None = Field(
        None, description="verl's {path, name, reward_kwargs}: run as one more entry of functions"
    )
    clip: float | None = Field(
        None,
        gt=0,
        description="each component's reward (and turn rewards) clipped to [-clip, clip] (null: not clipped)",
    )
    max_abs: float | None = Field(
        REWARD_MAX_ABS,
        gt=0,
        description="without clip, a component's reward beyond +-max_abs fails its episode (null: no bound)",
    )

    @field_validator("functions", mode="before")
    @classmethod
    def _function_shorthand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"function": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _verl_function(self) -> "RewardConfig":
        if self.custom_reward_function is not None:
            entry = self.custom_reward_function.as_function()
            self.custom_reward_function = None
            if entry is not None:
                self.functions.append(entry)
        return self

    @property
    def empty(self) -> bool:
        return not self.functions and not self.judges


class EpisodeSources(Protocol):
    """What decides an episode's task and reward outside the graph: a verlog config, or the
    ``verlog:`` block of a verl config (``verlog.integrations.verl.settings.VerlSettings``)."""

    data: DataConfig | None
    reward: RewardConfig


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
    max_consecutive_failures: int = Field(20, ge=1, description="a slot failing this often in a row stops the run")
    seed: int = Field(0, description="torch / python RNG seed")
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads of the training passes (default: all cores but one, like the engine)"
    )

    @model_validator(mode="after")
    def _check_groups(self) -> "TrainerConfig":
        if self.num_envs % self.group_size:
            raise ValueError(f"group_size ({self.group_size}) must divide num_envs ({self.num_envs})")
        if self.stop_at_win_rate is not None and not self.eval_every:
            raise ValueError("stop_at_win_rate needs periodic evaluations: set eval_every > 0")
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


class EvalTaskConfig(_Section):
    """One evaluation task: a name and the graph_kwargs that select it."""

    name: str
    graph_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("graph_kwargs", mode="before")
    @classmethod
    def _check_graph_kwargs(cls, value: Any) -> dict[str, Any]:
        return _keyword_mapping(value, "keyword arguments of build_graph", "{task: goto}")


#: evaluation episodes per task of seed-made games when ``eval.episodes`` is not set
DEFAULT_EVAL_EPISODES = 32


class EvalConfig(_Section):
    """Evaluation episodes: held-out seeds, sampling temperature, when to run."""

    episodes: int | None = Field(
        None, ge=1, description="episodes per task (default: 32 seeds; with a data split, all of its rows)"
    )
    split: EvalSplitName = Field(
        "test",
        description="with a data section: the split of the final evaluation and of verlog eval (the "
        "periodic ones, eval_every, play the validation split)",
    )
    seed: int = Field(1_000_000, description="first seed (held out: far from training seeds)")
    validation_seed: int = Field(
        2_000_000, description="first seed of the periodic evaluations (eval_every), apart from the final ones"
    )
    temperature: float | None = Field(None, ge=0, description="sampling temperature (null: sampling.temperature)")
    concurrency: int = Field(64, ge=1)
    at_start: bool = Field(False, description="evaluate the initial policy before training")
    at_end: bool = Field(True, description="evaluate the final policy after training")
    tasks: list[EvalTaskConfig] = Field(
        default_factory=list, description="tasks to evaluate (default: the training graph's own)"
    )

    def episode_count(self, rows: int | None = None) -> int:
        """Episodes per task: ``episodes``, else every row of a data split (``rows``), else
        ``DEFAULT_EVAL_EPISODES``; never more than the split's rows (a row is played once)."""
        if rows is None:
            return self.episodes or DEFAULT_EVAL_EPISODES
        return min(self.episodes or rows, rows)


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


# ---------------------------------------------------------------------- loading


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The field names allowed at the parent of ``loc`` (None when it is a free-form dict)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return None
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields is not None else None


def _describe(exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc)
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {key}: unknown key{hint}")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = f" (got {err.get('input')!r})" if loc else ""  # not the whole file
            lines.append(f"  {key}: {msg}{got}")
    return "\n".join(lines)


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=[x, y]"]`` -> ``[(["a", "b"], 1), (["c"], ["x", "y"])]`` (values as YAML)."""
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {exc}") from exc
        parsed.append((key.strip().split("."), value))
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each dotted key in a copy of ``data`` (intermediate sections are created)."""
    data = yaml.safe_load(yaml.safe_dump(data)) or {}
    for path, value in parse_overrides(overrides):
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def config_from_dict(data: dict[str, Any], *, source: str = "<config>") -> VerlogConfig:
    """Validate a mapping as a ``VerlogConfig``; raise ``ConfigError`` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    if "actor_rollout_ref" in data:
        raise ConfigError(
            f"{source} is a verl config (it has actor_rollout_ref): train it with "
            f"`verlog train --engine verl {source}` (see docs/verl.md); verlog's other commands "
            "take verlog configs such as configs/babyai.yaml"
        )
    try:
        return VerlogConfig.model_validate(data)
    except ValidationError as exc:
        lines = _describe(exc, VerlogConfig).splitlines()
        if len(lines) == 1:  # one bad key: one line
            raise ConfigError(f"invalid config {source}: {lines[0].strip()}") from None
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(lines)) from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (an empty file is ``{}``); a clear ``ConfigError`` for
    a missing file, invalid YAML or a top level that is not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> VerlogConfig:
    """Read a YAML config file, apply ``key=value`` overrides, validate.

    A relative ``multi_turn.langgraph.path`` is resolved against the current directory first,
    then against the config file's folder and its parent (so configs/x.yaml may say graphs/x.py).
    """
    path = Path(path)
    config = config_from_dict(apply_overrides(read_yaml_mapping(path), overrides), source=str(path))
    bases = (path.parent, path.parent.parent)
    config.multi_turn.langgraph.path = resolve_path(config.multi_turn.langgraph.path, bases)
    if config.data is not None:
        for name in SPLITS:
            source = config.data.split(name)
            if source is not None:
                source.path = resolve_path(source.path, bases)
    for function in config.reward.functions:
        target, _, name = function.function.rpartition(":")
        if target.endswith(".py"):
            function.function = f"{resolve_path(target, bases)}:{name}"
    responder = config.multi_turn.langgraph.on_interrupt
    if responder and responder.rpartition(":")[0].endswith(".py"):
        target, _, name = responder.rpartition(":")
        config.multi_turn.langgraph.on_interrupt = f"{resolve_path(target, bases)}:{name}"
    return config


def resolve_path(path: str, bases: Sequence[Path]) -> str:
    """A relative ``path`` as given when it exists from the current directory, else joined to the
    first of ``bases`` where it exists (a config's folder and its parent: configs/x.yaml may say
    graphs/x.py or data/x.jsonl); unchanged when it exists nowhere (the error comes on use).
    Globs (``data/*.jsonl``) are kept as given."""
    if Path(path).is_absolute() or Path(path).exists() or any(c in path for c in "*?["):
        return path
    for base in bases:
        if (base / path).exists():
            return str(base / path)
    return path
