"""The ``sft`` section: a supervised warm start of the config's graph from demonstrations.

``verlog sft CONFIG`` plays each demonstration source through the graph (or reads recorded
traces), keeps the episodes its filter accepts, and fine-tunes the policy on their answers. The
sources::

    sft:
      demonstrations:
        - {source: scripted, episodes: 512}                      # the game's bot (or agent: answer / file.py:fn)
        - {source: teacher, endpoint: {base_url: http://host/v1, model: big}, episodes: 256}
        - {source: traces, store: runs/serve/traces, min_reward: 1.0}
        - {source: policy, episodes: 256, rounds: 3}             # the policy's own successes, again and again

The part of the model that trains (``actor.train_layers``, ``actor.lora``) and the token budget of a
pass (``algorithm.micro_batch_tokens``) are the training run's own; the optimizer is this section's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from verlog.config.base import _check_function_target, _keyword_mapping, _Section
from verlog.config.rewards import JudgeEndpointConfig

#: where demonstrations come from (``sft.demonstrations[].source``)
DEMONSTRATION_SOURCES = ("scripted", "teacher", "traces", "policy")
#: the scripted agents verlog ships (``agent``), besides a user's ``file.py:function``
SCRIPTED_AGENTS = ("game", "answer")


class DemonstrationsConfig(_Section):
    """One source of demonstrations: episodes of the graph whose model calls someone else answered
    (or the policy itself, kept when they went well), re-rendered through the policy's chat template."""

    source: Literal["scripted", "teacher", "traces", "policy"] = Field(
        description="scripted: a scripted agent answers the graph's calls (the game's bot, a row's answer, "
        "your function); teacher: an OpenAI-compatible endpoint answers them; traces: recorded production "
        "episodes (verlog serve-model --record); policy: the policy's own episodes (rejection sampling)"
    )
    episodes: int | None = Field(
        None, ge=1, description="episodes played (scripted, teacher, policy; default: 256 seeds, or every row)"
    )
    seed: int = Field(0, ge=0, description="first seed (games) or row (data) the episodes play")
    split: Literal["train", "validation", "test"] = Field(
        "train", description="with a data section: the split whose rows are played"
    )
    graph_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="build_graph keyword arguments of this source's episodes, over multi_turn.langgraph's "
        "(e.g. {task: pickup}: one source per task)",
    )
    agent: str = Field(
        "game",
        description="scripted: game (the game's own bot plays: BabyAI's, the Sokoban solver, TextWorld's "
        "walkthrough...), answer (a row's answer column, answer_column), or file.py:function (your agent: "
        "called with a verlog.sft.DemoCall, returns the answer)",
    )
    answer_column: str = Field("answer", description="agent answer: the column holding each row's answer")
    endpoint: JudgeEndpointConfig | None = Field(None, description="teacher: the endpoint answering the calls")
    temperature: float = Field(0.0, ge=0, description="teacher: its sampling temperature (0: greedy)")
    max_tokens: int | None = Field(None, ge=1, description="teacher: its answer budget (default: the call's own)")
    store: str | None = Field(None, description="traces: the trace store (the folder given to --record, or a URL)")
    rounds: int = Field(1, ge=1, description="policy: rounds of play, keep, fine-tune (expert iteration)")
    keep: Literal["success", "all"] = Field(
        "success",
        description="which episodes are demonstrations: success (the game's or reward's success; an episode "
        "without one counts as a success when its return reaches min_reward) or all of those that ended well",
    )
    min_reward: float | None = Field(
        None, description="kept only if the episode's return (traces: its feedback reward) is at least this"
    )
    concurrency: int = Field(32, ge=1, description="episodes played at once")

    @field_validator("graph_kwargs", mode="before")
    @classmethod
    def _check_graph_kwargs(cls, value: Any) -> dict[str, Any]:
        return _keyword_mapping(value, "keyword arguments of build_graph", "{task: pickup}")

    @field_validator("agent")
    @classmethod
    def _check_agent(cls, value: str) -> str:
        if value in SCRIPTED_AGENTS:
            return value
        try:
            return _check_function_target(value)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(SCRIPTED_AGENTS)} or file.py:function") from None

    @model_validator(mode="after")
    def _check_source(self) -> "DemonstrationsConfig":
        if self.source == "teacher" and self.endpoint is None:
            raise ValueError("source teacher needs endpoint: {base_url: ..., model: ...}")
        if self.source == "traces" and not self.store:
            raise ValueError("source traces needs store: the trace store (the folder given to --record)")
        if self.source != "traces" and self.store:
            raise ValueError(f"store is for source traces, not {self.source}")
        if self.source != "teacher" and self.endpoint is not None:
            raise ValueError(f"endpoint is for source teacher, not {self.source}")
        if self.rounds > 1 and self.source != "policy":
            raise ValueError(f"rounds is for source policy (expert iteration), not {self.source}")
        return self


class SftConfig(_Section):
    """Supervised fine-tuning on demonstrations (``verlog sft``): loss on the answer tokens of
    each turn only, prompts exactly as the graph rendered them for the policy."""

    run_dir: str = Field("runs/sft", description="checkpoints, demonstrations, metrics.jsonl")
    demonstrations: list[DemonstrationsConfig] = Field(
        min_length=1, description="the sources, each played (or read) once"
    )
    epochs: int = Field(3, ge=1, description="passes over the demonstrations (each policy round: its own)")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant after warmup_steps)")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up from 0")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping (null: off)")
    batch_turns: int = Field(64, ge=1, description="turns per optimizer step")
    held_out_fraction: float = Field(
        0.05, ge=0, lt=1, description="share of the demonstration episodes kept out of training, for the held-out loss"
    )
    save_every: int = Field(0, ge=0, description="checkpoint every N optimizer steps (0: at each epoch's end)")
    keep_checkpoints: int = Field(2, ge=1)
    seed: int = Field(0, description="shuffling and the held-out split")
    critic: Literal["none", "monte_carlo"] = Field(
        "none",
        description="monte_carlo: also fit a critic to the demonstrations' discounted returns (gamma_step), saved "
        "with the checkpoint for verlog train --init-from; none: the PPO run pre-trains its critic (critic_warmup)",
    )
    critic_epochs: int = Field(2, ge=1, description="critic: passes over the demonstrations")

    @field_validator("demonstrations", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value
