"""The ``reward`` section: reward functions and LLM judges run on finished episodes, verl's
``custom_reward_function``; and what decides an episode's task and reward outside the graph."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field, field_validator, model_validator

from verlog.config.base import REWARD_MAX_ABS, VERL_REWARD_FUNCTION_NAME, _check_function_target, _Section
from verlog.config.data import DataConfig

if TYPE_CHECKING:
    pass


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
