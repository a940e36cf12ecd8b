"""A random-valid-action baseline beside a training run's evaluations.

A policy that has only learned the answer format plays about as well as random valid actions,
so a run's "after" win rate means something only next to that baseline. Here the baseline is a
chat model answering a uniformly random valid action of the game each turn (the bare action
name), playing the run's own graph on its own held-out eval seeds (``eval.seed`` onwards,
``eval.episode_count()`` per task), unchanged.

``python -m verlog.evaluation.baseline RUN_DIR`` reads the run's ``config.yaml`` and
``eval.json`` (what ``verlog train`` wrote), plays the baseline and prints one table per task:
random valid actions, before training, after training, each win rate ± standard error, and the
after-training gains over both in standard errors of the difference. ``make run`` ends with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import ensure_config
from pydantic import Field, PrivateAttr
from rich.console import Console
from rich.table import Table

from verlog.evaluation.results import TaskResult, difference, summarize
from verlog.evaluation.runner import EvalError, episode_seeds, play_tasks
from verlog.evaluation.tasks import EvalTask, config_tasks
from verlog.llm.chat_model import EPISODE_ID_KEY

__all__ = ["RandomActionChatModel", "comparison_table", "evaluate_random", "game_actions", "main"]


class RandomActionChatModel(BaseChatModel):
    """A LangChain chat model that answers a uniformly random one of ``actions`` (its bare name),
    whatever the prompt. Seeded per episode (``seed`` and the run's episode id), so a run is
    repeatable however many episodes play at once and in whatever order they call."""

    actions: list[str] = Field(min_length=1)
    seed: int = 0
    _rngs: dict[str, random.Random] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "random-valid-action"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        metadata = (run_manager.metadata if run_manager is not None else None) or ensure_config().get("metadata") or {}
        episode = str(metadata.get(EPISODE_ID_KEY, ""))
        with self._lock:  # an episode's calls come one after another; episodes may come from threads
            rng = self._rngs.get(episode)
            if rng is None:
                rng = self._rngs[episode] = random.Random(f"{self.seed}/{episode}")
            action = rng.choice(self.actions)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(action))])


def game_actions(task: EvalTask) -> list[str]:
    """The valid actions of the game a task's graph plays: the environment named after the graph
    file (``graphs/babyai.py`` -> ``babyai``) and its ``task`` keyword, in the graph's protocol."""
    from verlog.envs.registry import make_env

    kwargs = task.graph_kwargs
    name = f"{task.env}:{kwargs['task']}" if "task" in kwargs else task.env
    try:
        env = make_env(name, protocol=kwargs.get("protocol", "verlog"))
    except Exception as exc:  # noqa: BLE001 - any failure means: no game to take actions from
        raise EvalError(
            f"no random-action baseline for {task.label!r}: its game {name!r} cannot be made ({exc})"
        ) from None
    try:
        env.reset(0)
        return list(env.valid_actions())
    finally:
        env.close()


async def evaluate_random(config: Any, *, seed: int = 0) -> list[TaskResult]:
    """Play each eval task of ``config`` with random valid actions on the seeds the trainer
    evaluates (``eval.seed`` onwards, ``eval.episode_count()`` of them)."""
    ev = config.eval
    tasks = config_tasks(config)
    players = {t.key: RandomActionChatModel(actions=game_actions(t), seed=seed) for t in tasks}
    seeds = {t.key: episode_seeds(t) for t in tasks}
    records = await play_tasks(tasks, lambda t: players[t.key], seeds, concurrency=ev.concurrency)
    return summarize(records, [t.key for t in tasks]).tasks


def _gain(a: dict[str, Any], b: dict[str, Any] | TaskResult) -> str:
    b = b.as_dict() if isinstance(b, TaskResult) else b
    diff, se, in_se = difference((a["win_rate"], a["win_rate_se"]), (b["win_rate"], b["win_rate_se"]))
    return f"{diff:+.2f} ({in_se:+.1f} s.e.)" if se > 0 else f"{diff:+.2f}"


def comparison_table(
    task: str, random_result: TaskResult, before: dict[str, Any] | None, after: dict[str, Any] | None, updates: int
) -> Table:
    """One task: random valid actions, before and after training (win rate ± s.e., episodes),
    and the after-training gains (in standard errors of the difference)."""
    table = Table(
        title=f"{task}: win rate on {random_result.episodes} held-out seeds (mean ± standard error)",
        caption="after minus this: the difference, and in standard errors of the difference",
    )
    for col in ("player", "episodes", "win rate", "length", "after minus this"):
        table.add_column(col, justify="left" if col == "player" else "right")
    rows = [
        ("random valid actions", random_result.as_dict()),
        ("before training", before),
        (f"after {updates} updates", after),
    ]
    for name, r in rows:
        if r is None:
            continue
        gain = _gain(after, r) if after is not None and r is not after else ""
        table.add_row(
            name, str(r["episodes"]), f"{r['win_rate']:.2f} ± {r['win_rate_se']:.2f}", f"{r['length_mean']:.1f}", gain
        )
    return table


def _by_task(results: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {r["task"]: r for r in results or []}


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verlog.evaluation.baseline",
        description="Play random valid actions on a training run's held-out eval seeds and print them beside "
        "the run's win rates before and after training.",
    )
    parser.add_argument("run_dir", help="a verlog train run folder (its config.yaml and eval.json)")
    parser.add_argument("--seed", type=int, default=0, help="the random player's seed")
    args = parser.parse_args(argv)
    console = console or Console()

    from verlog.config import load_config

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").is_file():
        console.print(f"[red]error:[/] {run_dir} holds no config.yaml: give a verlog train run folder")
        return 2
    config = load_config(run_dir / "config.yaml")
    trained = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").is_file() else {}
    try:
        random_results = asyncio.run(evaluate_random(config, seed=args.seed))
    except EvalError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    before, after = _by_task(trained.get("before")), _by_task(trained.get("after"))
    for r in random_results:
        console.print(comparison_table(r.task, r, before.get(r.task), after.get(r.task), trained.get("updates", 0)))
    path = run_dir / "baseline.json"
    path.write_text(json.dumps({"random_valid_actions": [r.as_dict() for r in random_results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
