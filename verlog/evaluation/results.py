"""Evaluation results: one record per played episode, and their aggregation with standard errors.

An :class:`EpisodeRecord` is what ``verlog eval`` writes, one JSON line per finished episode. The
aggregation is BALROG's (arXiv 2411.13543; ``collect_and_summarize_results`` in its code):
progression is on a 0-100 scale; a task's score is the mean over its episodes and an
environment's the mean over *all* its episodes (not the mean of its tasks' means: the two agree
when every task has as many episodes); the overall score is the mean of the environments' scores
(each environment weighs the same however many tasks or episodes it has). Episodes that crashed
(status ``error``: the graph or the model endpoint failed) are left out, as BALROG leaves out the
episodes whose worker raised; ``verlog eval`` plays them again on the next run. Episodes that
stopped at an unanswered ``interrupt()`` (status ``interrupted``: the graph waits for a person, no
``multi_turn.langgraph.on_interrupt`` answered) are left out the same way, neither a win nor a
loss, and counted (``TaskResult.interrupted``); they are not played again (the same graph pauses
the same way: answer it, and the changed settings make a new evaluation). Standard errors
are BALROG's: the standard deviation with divisor n (not n - 1) over sqrt(n), and for the overall
mean of k environments ``sqrt(sum se_i^2) / k``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

__all__ = ["EpisodeRecord", "GroupResult", "Summary", "TaskResult", "mean_of_means", "mean_se", "summarize"]

#: BALROG reports progression per cent
PROGRESSION_SCALE = 100.0

#: statuses of episodes left out of every score (no verdict on the agent's play): ``error`` (the
#: graph or the endpoint failed; played again by the next run) and ``interrupted`` (paused for a
#: person nobody played). A ``recursion_limit`` episode is scored: the agent ran out of moves.
UNSCORED_STATUSES = ("error", "interrupted")


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error as BALROG computes it (the standard deviation with divisor n,
    over sqrt(n); 0 for one value)."""
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(xs) / n
    if n == 1:
        return mean, 0.0
    var = sum((x - mean) ** 2 for x in xs) / n
    return mean, math.sqrt(var / n)


def mean_of_means(parts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The unweighted mean of independent ``(mean, se)`` estimates, with its standard error."""
    if not parts:
        return float("nan"), float("nan")
    k = len(parts)
    return sum(m for m, _ in parts) / k, math.sqrt(sum(se * se for _, se in parts)) / k


def difference(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float, float]:
    """``a - b`` of two independent ``(mean, se)`` estimates: the difference, its standard error
    ``sqrt(se_a^2 + se_b^2)``, and the difference in those standard errors (``inf``/``-inf``/0 when
    the standard error is 0)."""
    diff, se = a[0] - b[0], math.sqrt(a[1] ** 2 + b[1] ** 2)
    in_se = diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0
    return diff, se, in_se


@dataclass
class EpisodeRecord:
    """One evaluated episode, as written to ``episodes.jsonl``.

    ``progression`` is BALROG's score of the episode on 0-100 (how far it got: the goal for
    goal-based games, achievements or points for Crafter and TextWorld, depth and level for
    NetHack). ``success`` is true only for an episode that ended normally with the goal reached.
    ``status`` is ``ok`` or how it failed (``error``, ``recursion_limit``, ``interrupted``);
    ``turns`` counts the model calls, ``episode_return`` the rewards the environment reported.
    """

    episode_id: str
    env: str
    task: str
    seed: int
    status: str
    turns: int
    episode_return: float
    success: bool
    progression: float
    seconds: float
    error: str | None = None
    #: a digest of what defines the episode (model, sampling, graph settings): finished episodes
    #: are reused only by an evaluation with the same one
    spec: str = ""
    #: Unix time at which the episode finished
    finished_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    @property
    def error_line(self) -> str:
        """The first line of the error (for one-line reports), or ``"an error"`` when there is none."""
        lines = (self.error or "").strip().splitlines()
        return lines[0] if lines else "an error"

    @property
    def label(self) -> str:
        """``env/task`` (just ``env`` when the task is the environment itself)."""
        return self.env if self.task == self.env else f"{self.env}/{self.task}"

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (``episode_return`` is written as ``return``)."""
        return {("return" if k == "episode_return" else k): v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EpisodeRecord":
        data = dict(data)
        data["episode_return"] = data.pop("return")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TaskResult:
    """One task's evaluation: win rate (0-1), return, and progression (0-100), each mean ± s.e."""

    task: str
    episodes: int
    failed: int
    win_rate: float
    win_rate_se: float
    return_mean: float
    return_se: float
    length_mean: float
    #: BALROG's progression on 0-100 (mean ± s.e.)
    progression: float | None = None
    progression_se: float | None = None
    #: the environment the task belongs to
    env: str = ""
    #: episodes that crashed (status ``error``), left out of every figure above
    errors: int = 0
    #: episodes stopped at an unanswered ``interrupt()`` (status ``interrupted``), left out too
    interrupted: int = 0

    @classmethod
    def from_records(cls, env: str, task: str, records: Sequence[EpisodeRecord]) -> "TaskResult":
        crashed = sum(r.status == "error" for r in records)
        paused = sum(r.status == "interrupted" for r in records)
        records = [r for r in records if r.status not in UNSCORED_STATUSES]
        win, win_se = mean_se([float(r.success) for r in records])
        ret, ret_se = mean_se([r.episode_return for r in records])
        prog, prog_se = mean_se([r.progression for r in records])
        length = sum(r.turns for r in records) / max(len(records), 1)
        return cls(
            task,
            len(records),
            sum(r.failed for r in records),
            win,
            win_se,
            ret,
            ret_se,
            length,
            prog,
            prog_se,
            env,
            crashed,
            paused,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupResult:
    """The progression of an environment (the mean over all its episodes) or of the whole run
    (the mean of the environments), 0-100, with its standard error."""

    name: str
    parts: int
    episodes: int
    progression: float
    progression_se: float
    win_rate: float
    win_rate_se: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Summary:
    """Per-task, per-environment and overall results of one evaluation."""

    tasks: list[TaskResult]
    envs: list[GroupResult]
    overall: GroupResult | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "tasks": [t.as_dict() for t in self.tasks],
            "envs": [e.as_dict() for e in self.envs],
            "overall": self.overall.as_dict() if self.overall else None,
        }


def _group(name: str, parts: Sequence[GroupResult]) -> GroupResult:
    """The mean of independent groups (the overall score over environments)."""
    prog = mean_of_means([(p.progression, p.progression_se) for p in parts])
    win = mean_of_means([(p.win_rate, p.win_rate_se) for p in parts])
    return GroupResult(name, len(parts), sum(p.episodes for p in parts), *prog, *win)


def _pooled(name: str, tasks: int, records: Sequence[EpisodeRecord]) -> GroupResult:
    """An environment's score: the mean over all its scored episodes (not crashed, not paused)."""
    kept = [r for r in records if r.status not in UNSCORED_STATUSES]
    prog = mean_se([r.progression for r in kept])
    win = mean_se([float(r.success) for r in kept])
    return GroupResult(name, tasks, len(kept), *prog, *win)


def summarize(records: Iterable[EpisodeRecord], order: Sequence[tuple[str, str]] | None = None) -> Summary:
    """Aggregate episode records by (environment, task), then environment, then overall.

    ``order``: the (env, task) pairs to report, in this order (default: as first seen); pairs
    without records are left out.
    """
    by_task: dict[tuple[str, str], list[EpisodeRecord]] = {}
    for record in records:
        by_task.setdefault((record.env, record.task), []).append(record)
    keys = [k for k in (order if order is not None else list(by_task)) if by_task.get(k)]
    tasks = [TaskResult.from_records(env, task, by_task[(env, task)]) for env, task in keys]
    envs: dict[str, list[tuple[str, str]]] = {}
    for key in keys:
        envs.setdefault(key[0], []).append(key)
    env_results = [_pooled(env, len(ks), [r for k in ks for r in by_task[k]]) for env, ks in envs.items()]
    overall = _group("overall", env_results) if env_results else None
    return Summary(tasks, env_results, overall)
