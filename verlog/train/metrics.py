"""What a training run reports each update, and where: ``metrics.jsonl``, wandb, the terminal.

``rollout_metrics`` summarizes a batch (episode returns, win rate, lengths, invalid actions,
failures, throughput); ``memory_metrics`` the process's memory; ``RunLogger`` writes one record
per update to ``<run_dir>/metrics.jsonl`` and to wandb (offline unless configured otherwise,
files under the run folder), and shows a progress bar with the headline figures (in a log file:
plain lines, one per update and evaluation).
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from verlog.config import VerlogConfig
from verlog.evaluation.report import eval_line
from verlog.evaluation.results import TaskResult
from verlog.rewards.scorer import COMPONENT_PREFIX
from verlog.rollout.slots import SlotBatch
from verlog.step_info import PROGRESSION_KEY, VALID_ACTION_KEY, episode_outcomes

__all__ = ["RunLogger", "group_metrics", "memory_metrics", "rollout_metrics", "truncate_after"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def rollout_metrics(batch: SlotBatch) -> dict[str, float]:
    """Figures of one collected batch (episodes are those that ended while it was collected)."""
    turns = batch.flat_turns()
    ended = batch.episodes
    wins = [float(won) for won in episode_outcomes(e.info for e in ended)]
    validity = [bool(t.info[VALID_ACTION_KEY]) for t in turns if VALID_ACTION_KEY in t.info]
    progression = [
        float(e.info[PROGRESSION_KEY]) for e in ended if isinstance(e.info.get(PROGRESSION_KEY), (int, float))
    ]
    return {
        "episodes": float(len(ended)),
        "episode_return": _mean([e.total_reward for e in ended]),
        "win_rate": _mean(wins),
        "progression": _mean(progression),
        "episode_length": _mean([float(len(e.turns)) for e in ended]),
        "invalid_action_rate": _mean([float(not v) for v in validity]),
        "failed_episodes": float(len(batch.failed)),
        "uncaptured_calls": float(batch.uncaptured_calls),
        "discarded_calls": float(batch.discarded_calls),
        "turn_reward": _mean([t.reward for t in turns]),
        "response_length": _mean([float(len(t.response_ids)) for t in turns]),
        "prompt_length": _mean([float(len(t.prompt_ids)) for t in turns]),
        "rollout_s": batch.seconds,
        "turns_per_s": len(turns) / batch.seconds if batch.seconds > 0 else float("nan"),
        # the turns each slot gave (stragglers: a slow slot gives fewer) and the slots' wait at the boundary
        "slot_turns_min": float(min((len(slot) for slot in batch.turns), default=0)),
        "slot_turns_max": float(batch.turns_per_env),
        "boundary_wait_s": batch.boundary_wait_s,
        "boundary_wait_max_s": batch.boundary_wait_max_s,
        **reward_components(ended),
        **group_metrics(batch),
    }


def group_metrics(batch: SlotBatch) -> dict[str, float]:
    """With whole groups: the groups compared in ``batch`` (all their plays began and ended in it)
    and those dropped whole (their last play ended in it, but they straddled a boundary or lost a
    play; their row is played again)."""
    if batch.compared is None:
        return {}
    return {"groups_compared": float(len(batch.whole_groups)), "groups_dropped": float(batch.groups_dropped)}


def reward_components(episodes: list[Any]) -> dict[str, float]:
    """The mean of each reward function's and judge's (unweighted) value over ``episodes``, under
    its info key (``reward/<name>``)."""
    values: dict[str, list[float]] = {}
    for episode in episodes:
        for key, value in episode.info.items():
            if key.startswith(COMPONENT_PREFIX) and isinstance(value, (int, float)):
                values.setdefault(key, []).append(float(value))
    return {key: _mean(v) for key, v in sorted(values.items())}


def memory_metrics() -> dict[str, float]:
    """Resident memory now and at its peak (GB), and the GPU's peak allocation when there is one."""
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak_kb / 2**20 if sys.platform != "darwin" else peak_kb / 2**30
    out = {"memory_peak_rss_gb": peak}
    try:
        with open("/proc/self/statm") as f:
            out["memory_rss_gb"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        pass
    if torch.cuda.is_available():
        out["gpu_memory_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


#: the figures shown on the progress line, with their short labels
_HEADLINE = (
    ("win_rate", "win"),
    ("episode_return", "return"),
    ("episode_length", "len"),
    ("value_loss", "v_loss"),
    ("explained_variance", "ev"),
    ("approx_kl", "kl"),
    ("clip_frac", "clip"),
    ("entropy", "ent"),
    ("turns_per_s", "turns/s"),
    ("sft_loss", "loss"),
    ("token_accuracy", "acc"),
    ("held_out_loss", "held-out loss"),
    ("held_out_accuracy", "held-out acc"),
)


def _untrained_note(metrics: dict[str, float]) -> str:
    """Why an update's policy loss used no token of its batch (``policy_token_frac`` 0), for its
    line; ``""`` when it used some. A critic-free estimator scores complete episodes only (a group
    estimator, whole groups only): a batch without one trains nothing, for every estimator alike."""
    if metrics.get("policy_token_frac", 1.0) > 0:
        return ""
    if metrics.get("dropped_group_frac", 0.0) >= 1.0:
        return "policy not trained: every compared group's returns were tied (algorithm.drop_uniform_groups)"
    return "policy not trained: no complete episode in this batch, hence no whole group to compare"


class RunLogger:
    """One record per update to ``metrics.jsonl``, wandb and a rich progress display; where the
    console is no terminal (a redirected stdout: ``nohup``, a scheduler's log file) the display is
    plain lines instead, one per update, evaluation and phase, each on one line and flushed."""

    def __init__(
        self,
        config: VerlogConfig,
        run_dir: Path,
        *,
        console: Console,
        start_update: int,
        wandb_id: str | None,
        resume: bool,
        total: int | None = None,
        step_kind: str = "update",
    ):
        self.path = run_dir / "metrics.jsonl"
        self.console = console
        self.started = time.perf_counter()
        #: the steps the progress bar counts (default: the run's updates) and what they are called
        self.total = config.trainer.total_updates if total is None else total
        self.step_kind = step_kind
        if resume:  # drop records of updates that will be redone, and a line cut by a kill
            for warning in truncate_after(self.path, start_update):
                console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        self.wandb = _start_wandb(config, run_dir, wandb_id, resume)
        self.wandb_id = getattr(self.wandb, "id", wandb_id)
        #: a log file, not a terminal: plain lines instead of the live progress bar
        self.plain = not console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[line]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(
            "training" if step_kind == "update" else step_kind, total=self.total, completed=start_update, line=""
        )

    def __enter__(self) -> "RunLogger":
        if not self.plain:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.plain:
            self.progress.stop()
        if self.wandb is not None:
            self.wandb.finish()

    def _line(self, text: str) -> None:
        """One plain line of the log form: elapsed time first, never wrapped, written at once."""
        self.console.print(f"[{_clock(self.elapsed())}] {text}", soft_wrap=True, highlight=False, markup=False)
        self.console.file.flush()

    def elapsed(self) -> float:
        """Seconds since this process started logging the run."""
        return time.perf_counter() - self.started

    def status(self, text: str, *, every_update: bool = False) -> None:
        """Say what the run is doing (e.g. critic warm-up) on the progress line; in the log form, a
        line of its own unless it is a phase of ``every_update`` (the update's line says enough)."""
        self.progress.update(self.task, line=text)
        if self.plain and not every_update:
            self._line(text)

    def log(self, update: int, metrics: dict[str, float], *, step_kind: str = "update") -> None:
        record = {
            "update": update,
            "kind": step_kind,
            "elapsed_s": self.elapsed(),
            **{k: _finite(v) for k, v in metrics.items()},
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            prefix = "" if step_kind == "update" else f"{step_kind}/"
            self.wandb.log({f"{prefix}{k}": v for k, v in metrics.items()}, step=update)
        line = " ".join(
            f"{label} {metrics[key]:.3g}" for key, label in _HEADLINE if key in metrics and not math.isnan(metrics[key])
        )
        if step_kind == "update" and (note := _untrained_note(metrics)):
            line = f"{line} ({note})" if line else f"({note})"
        if step_kind == self.step_kind:
            self.progress.update(self.task, completed=update, line=line)
        if self.plain:
            of = f"/{self.total}" if step_kind == self.step_kind else ""
            self._line(f"{step_kind} {update}{of} {line}")
        else:
            self.progress.console.print(f"[dim]{step_kind} {update}[/] {line}", highlight=False)

    def log_eval(self, update: int, results: Sequence[TaskResult], *, validation: bool = False) -> None:
        """An evaluation's results (``validation``: a periodic one, on its own seeds)."""
        kind = "validation" if validation else "eval"
        flat = {}
        for r in results:
            flat[f"{kind}/{r.task}/win_rate"] = r.win_rate
            flat[f"{kind}/{r.task}/return"] = r.return_mean
        records = [r.as_dict() for r in results]
        with self.path.open("a") as f:
            f.write(json.dumps({"update": update, "kind": kind, "elapsed_s": self.elapsed(), "tasks": records}) + "\n")
        if self.wandb is not None:
            self.wandb.log(flat, step=update)
        if self.plain:
            for r in results:
                self._line(f"{kind} at update {update}: {eval_line(r)}")


def _clock(seconds: float) -> str:
    """Elapsed time as h:mm:ss."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def truncate_after(path: Path, update: int) -> list[str]:
    """Keep the records of ``metrics.jsonl`` up to ``update`` (those of a resumed run's checkpoint).

    A run killed while writing leaves a cut last line: it is dropped. Every complete record is
    kept; a complete line that is not a JSON record is kept as it is. The file is replaced
    atomically. Returns warnings to show (what was dropped)."""
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    cut = lines.pop()  # the text after the last newline: '' unless the last write was cut
    warnings = []
    if cut.strip() and _is_record(cut):  # complete but for its newline
        lines.append(cut)
    elif cut.strip():
        warnings.append(
            f"{path}: dropped a cut last line ({len(cut)} characters) left by a run that was stopped while writing it"
        )
    kept = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            kept.append(line)
            continue
        step = record.get("update") if isinstance(record, dict) else None
        if not isinstance(step, (int, float)) or step <= update:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return warnings


def _is_record(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _start_wandb(config: VerlogConfig, run_dir: Path, run_id: str | None, resume: bool) -> Any:
    w = config.wandb
    if w.mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:  # pragma: no cover - wandb is a dependency
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=w.project,
        name=w.name or run_dir.name,
        tags=w.tags,
        mode=w.mode,
        dir=str(run_dir),
        id=run_id,
        resume="allow" if resume else None,
        config=config.model_dump(mode="json"),
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
