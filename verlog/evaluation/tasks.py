"""What an evaluation plays: tasks gathered from configs and suites.

An :class:`EvalTask` is one (environment, task) pair: a config (graph file, sampling, limits) and
the ``graph_kwargs`` that select the task. A config gives the tasks of its ``eval.tasks`` (or
the graph itself as one task); its environment is named after its graph file (``babyai`` for
``graphs/babyai.py``). A *suite* is a YAML file naming several configs and their tasks, e.g.
``configs/suites/balrog.yaml`` for BALROG's six environments::

    babyai:                          # the environment's name in the results
      config: ../babyai.yaml         # relative to the suite file
      overrides:                     # optional: key.path: value settings of that config
        rollout.episode_timeout_s: null
      graph_kwargs: {protocol: balrog}   # optional: graph_kwargs shared by its tasks
      tasks:                         # eval.tasks of that config
        - {name: goto, graph_kwargs: {task: goto}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from verlog.config import EVAL_SPLITS, ConfigError, EvalTaskConfig, VerlogConfig, load_config

__all__ = ["EvalTask", "config_tasks", "load_suite", "plan_tasks", "suite_path"]

#: where ``--suite NAME`` looks for ``NAME.yaml`` (the working directory first, then the project)
SUITE_DIRS = (Path("configs") / "suites", Path(__file__).resolve().parents[2] / "configs" / "suites")


@dataclass
class EvalTask:
    """One (environment, task) pair to evaluate."""

    env: str
    name: str
    config: VerlogConfig
    #: the config's ``graph_kwargs`` updated with the task's own
    graph_kwargs: dict[str, Any] = field(default_factory=dict)
    #: the data split whose rows the episodes play (``None``: seeds, ``make_input(seed)``)
    split: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.env, self.name)

    @property
    def label(self) -> str:
        return self.name if self.name == self.env else f"{self.env}/{self.name}"

    def episode_id(self, seed: int) -> str:
        """The stable id of this task's episode with ``seed`` (a row index for a data split: the
        split is named) — what resuming matches on."""
        return f"{self.label}/{self.split}-row{seed}" if self.split is not None else f"{self.label}/{seed}"


def env_name(config: VerlogConfig) -> str:
    """A config's environment name: its graph file's name (``graphs/babyai.py`` -> ``babyai``)."""
    return Path(config.multi_turn.langgraph.path).stem


def config_tasks(config: VerlogConfig, env: str | None = None, *, split: str | None = None) -> list[EvalTask]:
    """The tasks of ``config``: its ``eval.tasks``, or the graph itself under the environment's name.
    With a data section they play the rows of ``split`` (default ``eval.split``), never training rows;
    where neither names one and the default split has no file, the config's only evaluation split
    (a config with validation rows alone plays them)."""
    env = env or env_name(config)
    base = config.multi_turn.langgraph.graph_kwargs
    tasks = list(config.eval.tasks) or [EvalTaskConfig(name=env)]
    if config.data is None:
        split = None
    else:
        chosen = split is not None or "split" in config.eval.model_fields_set
        split = split or config.eval.split
        if split not in EVAL_SPLITS:
            raise ConfigError(f"eval.split: evaluations play the validation or test rows, not {split!r}")
        given = [s for s in EVAL_SPLITS if config.data.split(s) is not None]
        if config.data.split(split) is None and not chosen and len(given) == 1:
            split = given[0]
        if config.data.split(split) is None:
            raise ConfigError(
                f"data.{split} is not set: an evaluation plays that split's rows (give its file, or "
                "choose the other split with eval.split / --split)"
            )
    return [EvalTask(env, t.name, config, {**base, **t.graph_kwargs}, split=split) for t in tasks]


def suite_path(name: str) -> Path:
    """The suite file named ``name`` (a path, or a name under ``configs/suites/``)."""
    path = Path(name)
    if path.is_file():
        return path
    for folder in SUITE_DIRS:
        candidate = folder / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for folder in SUITE_DIRS if folder.is_dir() for p in folder.glob("*.yaml")})
    raise ConfigError(f"--suite {name!r}: no such suite file; known suites: {', '.join(known) or 'none'}")


#: the keys a suite entry may have
SUITE_KEYS = ("config", "overrides", "graph_kwargs", "tasks")


def load_suite(name: str) -> list[tuple[str, Path, list[dict[str, Any]], list[str]]]:
    """A suite's environments: ``(env name, config path, tasks, overrides)`` in file order; the
    entry's shared ``graph_kwargs`` are merged into each task's (the task's own win), its
    ``overrides`` come back as ``key=value`` strings."""
    path = suite_path(name)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a suite maps environment names to {{config, tasks}}")
    envs = []
    for env, entry in data.items():
        if not isinstance(entry, dict) or "config" not in entry or set(entry) - set(SUITE_KEYS):
            raise ConfigError(
                f"{path}: {env}: expected the keys {', '.join(SUITE_KEYS)} (config required), got {entry!r}"
            )
        tasks = entry.get("tasks") or []
        shared = entry.get("graph_kwargs") or {}
        overrides = entry.get("overrides") or {}
        if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
            raise ConfigError(f"{path}: {env}.tasks must be a list of {{name, graph_kwargs}}")
        if not isinstance(shared, dict) or not isinstance(overrides, dict):
            raise ConfigError(f"{path}: {env}.graph_kwargs and {env}.overrides must be mappings")
        if shared:
            tasks = [{**t, "graph_kwargs": {**shared, **(t.get("graph_kwargs") or {})}} for t in tasks] or [
                {"name": str(env), "graph_kwargs": dict(shared)}
            ]
        settings = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
        envs.append((str(env), (path.parent / entry["config"]).resolve(), tasks, settings))
    return envs


def plan_tasks(
    configs: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    suite: str | None = None,
    split: str | None = None,
) -> list[EvalTask]:
    """Every task of the suite's environments, then of each config, ``overrides`` applied to all;
    configs with a data section play the rows of ``split`` (default: their ``eval.split``).

    Two environments may not share a name (their episodes would share ids).
    """
    tasks: list[EvalTask] = []
    if suite is not None:
        for env, path, suite_tasks, settings in load_suite(suite):
            config = load_config(path, [*settings, f"eval.tasks={json.dumps(suite_tasks)}", *overrides])
            tasks += config_tasks(config, env)
    for path in configs:
        config = load_config(path, overrides)
        if split is not None and config.data is None:
            raise ConfigError(
                f"--split {split}: {path} has no data rows to split (its episodes come from "
                "make_input(seed)); drop --split, or add a data section with the split's file"
            )
        tasks += config_tasks(config, split=split)
    if not tasks:
        raise ConfigError("nothing to evaluate: give one or more config files or --suite NAME")
    owners: dict[str, str] = {}
    for t in tasks:
        source = t.config.multi_turn.langgraph.path
        if owners.setdefault(t.env, source) != source:
            raise ConfigError(f"two configs evaluate an environment named {t.env!r}: evaluate them in separate runs")
    seen = set()
    for t in tasks:
        if t.key in seen:
            raise ConfigError(
                f"task {t.label!r} is listed twice (name the tasks apart in the configs' eval.tasks: "
                "[{name: ..., graph_kwargs: {...}}])"
            )
        seen.add(t.key)
    return tasks
