"""Evaluation: seeded episodes of a config's graph, win rate and return as mean ± standard error.

``evaluate`` plays ``episodes`` episodes per task on held-out seeds (``eval.seed`` on) with a
given engine; ``verlog eval CONFIG --checkpoint DIR`` does it for a trained checkpoint and
writes JSON next to the printed table. A failed episode counts as not won, with the reward it
had collected. Success is the ``success`` flag the environment reports with its last reward;
games that report BALROG's ``progression`` (0-1, e.g. Crafter's achievements / 22) get it
averaged too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from verlog.agent import build_chat_model
from verlog.backends.base import Engine
from verlog.config import EvalTaskConfig, VerlogConfig
from verlog.graph_file import load_graph_file
from verlog.rollout import Episode, run_episodes

__all__ = ["TaskResult", "evaluate", "eval_table", "mean_se"]


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n); 0 for one value)."""
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(xs) / n
    if n == 1:
        return mean, 0.0
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass
class TaskResult:
    """One task's evaluation."""

    task: str
    episodes: int
    failed: int
    win_rate: float
    win_rate_se: float
    return_mean: float
    return_se: float
    length_mean: float
    #: BALROG's progression (mean ± s.e.), when the game reports one
    progression: float | None = None
    progression_se: float | None = None

    @classmethod
    def from_episodes(cls, task: str, episodes: list[Episode]) -> "TaskResult":
        wins = [float(not e.failed and bool(e.info.get("success"))) for e in episodes]
        returns = [e.total_reward for e in episodes]
        win, win_se = mean_se(wins)
        ret, ret_se = mean_se(returns)
        length = sum(len(e.turns) for e in episodes) / max(len(episodes), 1)
        result = cls(task, len(episodes), sum(e.failed for e in episodes), win, win_se, ret, ret_se, length)
        if any("progression" in e.info for e in episodes):
            result.progression, result.progression_se = mean_se(
                [0.0 if e.failed else float(e.info.get("progression", 0.0)) for e in episodes]
            )
        return result

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def eval_tasks(config: VerlogConfig) -> list[EvalTaskConfig]:
    """The configured tasks, or the training graph itself under its file's name."""
    if config.eval.tasks:
        return list(config.eval.tasks)
    return [EvalTaskConfig(name=Path(config.multi_turn.langgraph.path).stem)]


async def evaluate(
    config: VerlogConfig,
    engine: Engine,
    tokenizer: Any,
    *,
    episodes: int | None = None,
    seed: int | None = None,
    temperature: float | None = None,
) -> list[TaskResult]:
    """Play each eval task's episodes on ``engine``; seeds ``seed, seed + 1, ...`` (default ``eval.seed``)."""
    ev = config.eval
    n = episodes or ev.episodes
    first = ev.seed if seed is None else seed
    temp = temperature if temperature is not None else (ev.temperature if ev.temperature is not None else config.sampling.temperature)
    graph_file = load_graph_file(config.multi_turn.langgraph.path)
    chat_model = build_chat_model(config, engine, tokenizer).model_copy(update={"temperature": temp})
    lg = config.multi_turn.langgraph
    results = []
    for task in eval_tasks(config):
        graph = graph_file.build(chat_model, **{**lg.graph_kwargs, **task.graph_kwargs})
        seeds = range(first, first + n)
        played = await run_episodes(
            graph, [graph_file.episode_input(s) for s in seeds], episode_ids=[f"eval-{task.name}-{s}" for s in seeds],
            concurrency=ev.concurrency, graph_config=lg.graph_config, timeout_s=config.rollout.episode_timeout_s,
        )
        results.append(TaskResult.from_episodes(task.name, played))
    return results


def eval_table(results: list[TaskResult], title: str = "evaluation") -> Table:
    """The results as a table: win rate and return as mean ± standard error."""
    table = Table(title=title)
    progression = any(r.progression is not None for r in results)
    columns = ["task", "episodes", "win rate", "return", *(["progression"] if progression else []), "length", "failed"]
    for col in columns:
        table.add_column(col, justify="left" if col == "task" else "right")
    for r in results:
        extra = [_pm(r.progression, r.progression_se) if r.progression is not None else "-"] if progression else []
        table.add_row(
            r.task, str(r.episodes), _pm(r.win_rate, r.win_rate_se), _pm(r.return_mean, r.return_se),
            *extra, f"{r.length_mean:.1f}", str(r.failed),
        )
    return table


def _pm(mean: float, se: float) -> str:
    return f"{mean:.2f}±{se:.2f}"


def print_results(results: list[TaskResult], console: Console, title: str = "evaluation") -> None:
    console.print(eval_table(results, title))


def run_eval_command(
    config: VerlogConfig, *, checkpoint: str | None, episodes: int | None, json_path: str | None, console: Console
) -> list[TaskResult]:
    """``verlog eval``: load the checkpoint's policy (or ``model.path``), evaluate, print, write JSON."""
    import asyncio
    import json

    from verlog.agent import build_engine, pick_device
    from verlog.models import load_tokenizer
    from verlog.train.checkpoint import resolve_checkpoint
    from verlog.train.models import load_actor

    tokenizer = load_tokenizer(config.model.path)
    source = config.model.path
    folder = None
    if checkpoint is not None:
        folder = resolve_checkpoint(checkpoint)
        source = str(folder)
    with console.status(f"loading {source}..."):
        if folder is not None and (folder / "actor_adapter").is_dir():
            from peft import PeftModel

            base, _ = load_actor(config.model.path, dtype=config.model.dtype, device=pick_device(config.model.device),
                                 lora=config.actor.lora.model_copy(update={"rank": 0}))
            model = PeftModel.from_pretrained(base, folder / "actor_adapter").merge_and_unload().eval()
        else:
            path = folder / "actor" if folder is not None else config.model.path
            model, _ = load_actor(path, dtype=config.model.dtype, device=pick_device(config.model.device),
                                  lora=config.actor.lora.model_copy(update={"rank": 0}))
        engine = build_engine(config, tokenizer, model)
    n = episodes or config.eval.episodes
    console.print(f"evaluating [bold]{source}[/]: {n} episodes per task, seeds from {config.eval.seed}")

    async def run() -> list[TaskResult]:
        try:
            return await evaluate(config, engine, tokenizer, episodes=n)
        finally:
            await engine.aclose()

    results = asyncio.run(run())
    print_results(results, console, f"evaluation of {source}")
    out = Path(json_path) if json_path else (folder / "eval.json" if folder is not None else Path("eval.json"))
    out.write_text(json.dumps({"model": source, "episodes": n, "seed": config.eval.seed,
                               "tasks": [r.as_dict() for r in results]}, indent=1))
    console.print(f"results written to {out}")
    return results
