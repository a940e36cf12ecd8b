"""The ``eval`` section: held-out episodes, their seeds or rows, sampling and when they run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from verlog.config.base import _keyword_mapping, _Section
from verlog.config.data import EvalSplitName

if TYPE_CHECKING:
    pass


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
