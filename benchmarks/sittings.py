"""What the learning benchmarks share about a training run: the commit it ran on, the machine's
load while it ran, the sittings a killed-and-resumed run took, its ``metrics.jsonl`` read back, and
the before/after comparison (:func:`train_and_compare`: train or resume, then random valid actions
on the same held-out episodes; win rates mean ± s.e. and their differences in standard errors).

A run folder holds ``sittings.json``, one entry per sitting (start, wall seconds, load, commit), kept
up to date while the sitting runs, so a killed sitting keeps its record. Training time is read from
the ``elapsed_s`` stamps of ``metrics.jsonl``, whose clock starts again at 0 in a resumed sitting.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "LoadSampler",
    "MetricsTail",
    "Sittings",
    "add_overrides",
    "commit",
    "comparison_main",
    "comparison_rows",
    "figures",
    "gap",
    "metric_records",
    "num",
    "timed",
    "train_and_compare",
    "training_wall",
]


def commit() -> str:
    """The repository's short commit hash (``unknown`` outside a git checkout)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def add_overrides(parser: Any) -> None:
    """A benchmark command's ``--set KEY=VALUE ...`` config overrides (``--set`` may repeat)."""
    parser.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="more config overrides (last; --set may repeat)",
    )


def num(value: Any) -> float:
    """A figure of ``metrics.jsonl`` (where NaN is written as null)."""
    return float("nan") if value is None else float(value)


class LoadSampler:
    """The machine's 1-minute load average, sampled every ``every_s`` seconds while a run goes on."""

    def __init__(self, every_s: float = 30.0, on_sample: Callable[[dict[str, float]], None] | None = None) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._on_sample = on_sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])
            if self._on_sample is not None:
                self._on_sample(self.summary())

    def summary(self) -> dict[str, float]:
        return {"mean": sum(self.samples) / len(self.samples), "max": max(self.samples), "samples": len(self.samples)}

    def stop(self) -> dict[str, float]:
        self._stop.set()
        return self.summary()


class Sittings:
    """The sittings of one run folder: the earlier ones read from ``sittings.json`` and this one,
    rewritten there at every load sample while it runs (so a killed sitting keeps its record)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "sittings.json"
        self.earlier = json.loads(self.path.read_text()) if self.path.is_file() else []
        self._clock, self._commit, self._started = time.strftime("%Y-%m-%d %H:%M:%S"), commit(), time.perf_counter()
        self._load = LoadSampler(on_sample=self._record)

    def _record(self, load: dict[str, float]) -> None:
        sitting = {
            "started": self._clock,
            "wall_s": time.perf_counter() - self._started,
            "load": load,
            "commit": self._commit,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps([*self.earlier, sitting], indent=1))

    def close(self) -> list[dict[str, Any]]:
        """End this sitting; every sitting's record."""
        self._record(self._load.stop())
        return json.loads(self.path.read_text())

    @staticmethod
    def load_of(sittings: list[dict[str, Any]]) -> dict[str, float]:
        """The load over all sittings (their means weighted by wall time)."""
        wall = sum(s["wall_s"] for s in sittings)
        return {
            "mean": sum(s["load"]["mean"] * s["wall_s"] for s in sittings) / max(wall, 1e-9),
            "max": max(s["load"]["max"] for s in sittings),
            "samples": sum(s["load"]["samples"] for s in sittings),
        }


def metric_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (every sitting's, in order)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def timed(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each record with the wall seconds since the one before it in the same sitting (a resumed
    sitting's ``elapsed_s`` clock starts again from 0)."""
    out, last = [], 0.0
    for r in records:
        if r["elapsed_s"] < last:  # a new sitting
            last = 0.0
        out.append((r, r["elapsed_s"] - last))
        last = r["elapsed_s"]
    return out


def training_wall(records: list[dict[str, Any]]) -> float:
    """Wall seconds of training alone (critic pre-training and updates, evaluations left out), summed
    over the sittings."""
    return sum(seconds for r, seconds in timed(records) if r["kind"] in ("update", "critic_warmup"))


class MetricsTail:
    """Prints a line per record appended to a run's ``metrics.jsonl`` while it trains (progress for a
    log file); ``line_of`` words a record (``None``: print nothing)."""

    def __init__(self, path: Path, line_of: Callable[[dict[str, Any]], str | None]) -> None:
        self.path, self.line_of = path, line_of
        self.offset = path.stat().st_size if path.is_file() else 0  # a resumed run's earlier lines were shown
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(5.0):
            self._read()

    def _read(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            appended = f.read()
        complete = appended[: appended.rfind(b"\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            text = self.line_of(json.loads(line))
            if text is not None:
                print(text, flush=True)

    def stop(self) -> None:
        self._stop.set()
        self._read()


def figures(task: dict[str, Any]) -> dict[str, float]:
    """An evaluation's win rate (mean ± s.e.; the game's success), return (mean ± s.e.) and length."""
    return {
        "episodes": task["episodes"],
        "win_rate": task["win_rate"],
        "win_rate_se": task["win_rate_se"],
        "return": task["return_mean"],
        "return_se": task["return_se"],
        "length": task["length_mean"],
    }


def gap(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """``a - b`` in win rate and in standard errors of the difference (independent samples)."""
    from verlog.evaluation.results import difference

    diff, se, in_se = difference((a["win_rate"], a["win_rate_se"]), (b["win_rate"], b["win_rate_se"]))
    return {"diff": diff, "se": se, "in_se": in_se}


def comparison_rows(s: dict[str, Any], random_label: str, cell: Callable[[dict[str, float]], str]) -> list[str]:
    """The table rows of a :func:`train_and_compare` result ``s`` (random, before, after; each
    player's figures in ``cell``'s columns), a blank line, and the differences in standard errors."""
    return [
        f"| {random_label} | {cell(s['random'])} |",
        f"| before training | {cell(s['before'])} |",
        f"| after {s['updates']} updates | {cell(s['after'])} |",
        "",
        f"after − before: {s['after_vs_before']['diff']:+.3f} ({s['after_vs_before']['in_se']:+.1f} s.e. of the "
        f"difference); after − random: {s['after_vs_random']['diff']:+.3f} ({s['after_vs_random']['in_se']:+.1f} s.e.)",
    ]


def training_seeds(config: Any, records: list[dict[str, Any]]) -> list[int] | None:
    """The seeds training played, ``[first, last]`` (the trainer's ``seed_max``), and a clear
    error if they reach the held-out seeds the comparison evaluates on (``eval.seed`` onwards):
    its scores would then not be held out. ``None`` for a run that draws no seeds (data rows)."""
    played = [r["seed_max"] for r in records if r["kind"] == "update" and r.get("seed_max") is not None]
    if not played:
        return None
    first, last = int(config.rollout.seed), int(max(played))
    held_out = range(config.eval.seed, config.eval.seed + config.eval.episode_count())
    if first <= held_out.stop - 1 and held_out.start <= last:
        raise SystemExit(
            f"error: training played seeds {first}..{last}, which reach the held-out seeds {held_out.start}.."
            f"{held_out.stop - 1} the comparison evaluates on (rollout.seed, eval.seed): no result is written "
            f"(the run folder {config.trainer.run_dir} is kept)"
        )
    return [first, last]


def train_and_compare(
    config: Any, line_of: Callable[[dict[str, Any]], str | None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train ``config`` in its ``trainer.run_dir`` (resuming what is there; its evaluations before
    and after training are the config's ``eval.at_start``/``at_end``), printing ``line_of`` each
    record meanwhile; then random valid actions on the same held-out episodes. Returns the run's
    records and the comparison: ``commit``, ``before``, ``after``, ``random`` (:func:`figures`),
    ``after_vs_before``, ``after_vs_random`` (:func:`gap`), the seeds training played
    (:func:`training_seeds`, refused where they reach the held-out ones), training, evaluation and baseline
    seconds, the sittings' wall time and load."""
    import asyncio

    from rich.console import Console

    from verlog.evaluation.baseline import evaluate_random
    from verlog.train import train

    run_dir = Path(config.trainer.run_dir)
    watcher = MetricsTail(run_dir / "metrics.jsonl", line_of)
    sitting = Sittings(run_dir)  # a run may take several sittings (killed, then resumed)
    train(config, resume=(run_dir / "metrics.jsonl").is_file(), console=Console(quiet=True))
    watcher.stop()
    sittings = sitting.close()
    records = metric_records(run_dir)
    seeds = training_seeds(config, records)
    started = time.perf_counter()
    random = figures(asyncio.run(evaluate_random(config, seed=0))[0].as_dict())
    random_s = time.perf_counter() - started
    evals = [(r, seconds) for r, seconds in timed(records) if r["kind"] == "eval"]
    before = next(figures(r["tasks"][0]) for r, _ in evals if r["update"] == 0)
    after = next(figures(r["tasks"][0]) for r, _ in reversed(evals) if r["update"] > 0)
    return records, {
        "commit": commit(),
        "before": before,
        "after": after,
        "random": random,
        "after_vs_before": gap(after, before),
        "after_vs_random": gap(after, random),
        "training_seeds": seeds,
        "training_wall_s": training_wall(records),
        "eval_s": sum(s for _, s in evals),
        "random_s": random_s,
        "wall_s": sum(s["wall_s"] for s in sittings),
        "load": Sittings.load_of(sittings),
        "sittings": sittings,
    }


def comparison_main(
    argv: list[str] | None,
    *,
    description: str,
    script: str,
    out: Path,
    results: Path,
    run: Callable[[Any], Any],
    show: Callable[[dict[str, Any]], str],
    more_run_args: Callable[[Any], None] | None = None,
) -> int:
    """The command line of a before/after benchmark: ``run`` (``--updates``, ``--set``, ``--out``,
    ``--results`` and ``more_run_args``'s; ``run(args)`` trains and compares) and ``show`` (prints
    the result file with ``show``)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train and evaluate (run again to resume)")
    p.add_argument("--updates", type=int, default=None, help="trainer.total_updates (default: the config's)")
    add_overrides(p)
    p.add_argument("--out", type=Path, default=out, help="where the run folder goes (checkpoints, metrics)")
    if more_run_args is not None:
        more_run_args(p)
    q = sub.add_parser("show", help="print the result file")
    for parser_ in (p, q):
        parser_.add_argument("--results", type=Path, default=results, help="where the result file goes")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
        return 0
    path = args.results / "result.json"
    if not path.is_file():
        print(f"error: no result file {path}: run `python {script} run` first", file=sys.stderr)
        return 2
    print(show(json.loads(path.read_text())), end="")
    return 0
