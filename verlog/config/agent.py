"""The sections of the agent and what runs it: the graph file (``multi_turn``), the model, the
engine, sampling and ``verlog rollout``'s episodes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from verlog.config.base import DEFAULT_MAX_RESUMES, SlotThreads, _check_function_target, _keyword_mapping, _Section

if TYPE_CHECKING:
    pass


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
    process: bool = Field(
        False,
        description="embedded, CPU: the engine runs in a process of its own, so its forward passes and the graphs' "
        "Python run at once instead of taking turns at the interpreter's lock (a script that starts one must do so "
        'under `if __name__ == "__main__":`)',
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
    slot_threads: SlotThreads = Field(
        "auto",
        description="where training's episodes run: auto, on the rollout's own event loop (no thread hop per "
        "model call) until a graph makes a blocking model call (model.invoke, stream or batch) in an async def "
        "node, whose episode is then played again and every slot gets a thread of its own; always, a thread per "
        "slot from the start (for async def nodes that block their loop with other work, e.g. time.sleep)",
    )
