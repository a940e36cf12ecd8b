"""Reporting an evaluation: terminal tables, the summary JSON and a PNG bar chart.

Progression is shown on BALROG's 0-100 scale, win rate as a fraction, each as mean ± standard
error. The chart needs matplotlib (``pip install 'verlog[eval]'``): :func:`require_matplotlib`
checks for it before an evaluation starts, so a missing package never costs a finished run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from verlog.evaluation.results import Summary, TaskResult
from verlog.evaluation.runner import EvalError

__all__ = [
    "eval_line",
    "eval_table",
    "plot_progression",
    "plus_minus",
    "print_results",
    "require_matplotlib",
    "summary_table",
    "write_json",
]


def plus_minus(mean: float | None, se: float | None, digits: int = 2) -> str:
    """``mean±se`` with ``digits`` decimals (``-`` for no mean)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.{digits}f}±{se or 0.0:.{digits}f}"


def eval_table(results: Sequence[TaskResult], title: str = "evaluation") -> Table:
    """Tasks as rows: win rate, return and progression (0-100) as mean ± standard error."""
    table = Table(title=title)
    longest = max([len(r.task) for r in results] + [4])
    paused = any(r.interrupted for r in results)
    for col in (
        "task",
        "episodes",
        "win rate",
        "return",
        "progression",
        "length",
        "failed",
        *(["interrupted"] if paused else []),
    ):
        table.add_column(
            col,
            justify="left" if col == "task" else "right",
            no_wrap=True,
            min_width=longest if col == "task" else None,
        )
    for r in results:
        table.add_row(
            r.task,
            str(r.episodes),
            plus_minus(r.win_rate, r.win_rate_se),
            plus_minus(r.return_mean, r.return_se),
            plus_minus(r.progression, r.progression_se, 1),
            f"{r.length_mean:.1f}",
            str(r.failed),
            *([str(r.interrupted)] if paused else []),
        )
    return table


def eval_line(result: TaskResult) -> str:
    """One task's row of :func:`eval_table` as a line of text (for log files)."""
    return (
        f"{result.task} win {plus_minus(result.win_rate, result.win_rate_se)} "
        f"return {plus_minus(result.return_mean, result.return_se)} "
        f"progression {plus_minus(result.progression, result.progression_se, 1)} length {result.length_mean:.1f} "
        f"({result.episodes} episodes, {result.failed} failed"
        + (f", {result.interrupted} interrupted" if result.interrupted else "")
        + ")"
    )


def print_results(results: Sequence[TaskResult], console: Console, title: str = "evaluation") -> None:
    """Print :func:`eval_table` (what the trainer shows before and after training)."""
    console.print(eval_table(results, title))


def summary_table(summary: Summary, title: str = "evaluation", not_the_suites_protocol: Sequence[str] = ()) -> Table:
    """One row per environment (with several tasks: its mean over them, then its tasks
    indented), and the overall mean over environments when there are several. A run that is not
    its suite's protocol (``not_the_suites_protocol``: the settings that differ) says so in the
    title and names them in the caption: its scores are not the suite's."""
    caption = "progression: BALROG's 0-100 score; n: episodes; mean ± standard error"
    if not_the_suites_protocol:
        title = f"{title} [yellow](not the suite's protocol)[/]"
        caption += f"\n[yellow]not the suite's protocol: {', '.join(not_the_suites_protocol)} differ from it[/]"
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False)
    # the task column is as wide as its longest name: names are never cut, into a file or a pipe
    longest = max(
        [len(f"  {t.task}") for t in summary.tasks]
        + [len(f"{t.env}/{t.task}") for t in summary.tasks]
        + [len("overall (00 envs)"), 14]
    )
    # episodes stopped at an unanswered interrupt() are not scored: a column counts them, when any
    paused = any(t.interrupted for t in summary.tasks)
    extra = [""] if paused else []
    for col in (
        "task",
        "n",
        "progression",
        "win rate",
        "return",
        "turns",
        "failed",
        *(["interrupted"] if paused else []),
    ):
        table.add_column(
            col,
            justify="left" if col == "task" else "right",
            no_wrap=True,
            min_width=longest if col == "task" else None,
        )
    envs = {e.name: e for e in summary.envs}
    by_env: dict[str, list[TaskResult]] = {}
    for t in summary.tasks:
        by_env.setdefault(t.env, []).append(t)
    for env, tasks in by_env.items():
        if len(tasks) > 1:
            e = envs[env]
            table.add_row(
                f"[bold]{env}[/]",
                str(e.episodes),
                f"[bold]{plus_minus(e.progression, e.progression_se, 1)}[/]",
                plus_minus(e.win_rate, e.win_rate_se),
                "",
                "",
                "",
                *extra,
            )
        for t in tasks:
            name = f"  {t.task}" if len(tasks) > 1 else (t.task if t.task == env else f"{env}/{t.task}")
            table.add_row(
                name,
                str(t.episodes),
                plus_minus(t.progression, t.progression_se, 1),
                plus_minus(t.win_rate, t.win_rate_se),
                plus_minus(t.return_mean, t.return_se),
                f"{t.length_mean:.1f}",
                str(t.failed),
                *([str(t.interrupted)] if paused else []),
            )
    if summary.overall is not None and len(summary.envs) > 1:
        o = summary.overall
        table.add_section()
        table.add_row(
            f"[bold]overall[/] ({o.parts} envs)",
            str(o.episodes),
            f"[bold]{plus_minus(o.progression, o.progression_se, 1)}[/]",
            plus_minus(o.win_rate, o.win_rate_se),
            "",
            "",
            "",
            *extra,
        )
    return table


def write_json(path: str | Path, summary: Summary, **about: Any) -> Path:
    """The summary as JSON: ``about`` (model, settings, ...) then tasks, envs and overall."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**about, **summary.as_dict()}
    path.write_text(json.dumps(data, indent=1))
    return path


def require_matplotlib() -> None:
    """Fail with :class:`EvalError` naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise EvalError(
            "the progression chart needs matplotlib: pip install 'verlog[eval]' (or pass --no-chart)"
        ) from None


def plot_progression(summary: Summary, path: str | Path, title: str = "progression") -> Path:
    """A PNG bar chart of progression (0-100) with standard-error bars: one bar per environment
    plus the overall mean, or one bar per task when a single environment was evaluated."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(summary.envs) > 1:
        bars = [(e.name, e.progression, e.progression_se) for e in summary.envs]
        assert summary.overall is not None
        bars.append(("overall", summary.overall.progression, summary.overall.progression_se))
    else:
        bars = [(t.task, t.progression or 0.0, t.progression_se or 0.0) for t in summary.tasks]
    names = [b[0] for b in bars]
    means = [0.0 if math.isnan(b[1]) else b[1] for b in bars]
    errors = [0.0 if math.isnan(b[2]) else b[2] for b in bars]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(bars) + 1.5), 4.0))
    colors = ["tab:blue"] * len(bars)
    if names[-1] == "overall" and len(summary.envs) > 1:
        colors[-1] = "tab:orange"
    ax.bar(range(len(bars)), means, yerr=errors, capsize=4, color=colors)
    for i, (m, e) in enumerate(zip(means, errors)):
        ax.text(i, min(m + e + 1.5, 104), f"{m:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(
        range(len(bars)), names, rotation=30 if len(bars) > 4 else 0, ha="right" if len(bars) > 4 else "center"
    )
    ax.set_ylim(0, 108)
    ax.set_ylabel("progression (0-100), mean ± s.e.")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
