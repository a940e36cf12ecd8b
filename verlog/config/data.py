"""The ``data`` section: task rows from files, their splits and formats, recorded traces, and
verl's data keys read as they are."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from verlog.config.base import _Section

if TYPE_CHECKING:
    pass


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
