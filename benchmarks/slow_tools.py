"""Slow tools: turns per second with and without straggler-tolerant batches (``trainer.stragglers``).

``graphs/slow_tool_corridor.py`` is the cue corridor with a tool called at every step that takes
``uniform(0, 4)`` seconds in one episode of four (and no time in the others), as an agent calling a
web service or a code runner does. ``configs/cue_corridor.yaml`` trains it (the toy model, 64 slots x
8 turns) for the same number of updates, so the same environment steps, in each mode:

* ``plain``      — a batch is cut once every slot has given its 8 turns: the slots playing a slow
  episode hold everyone at the boundary;
* ``stragglers`` — a batch is cut once 512 complete turns exist from any slots (at most 16 a slot):
  a slow slot's turns go to later batches (bootstrapped across the cut, each turn's staleness
  corrected with decoupled PPO).

Each result (``benchmarks/results/slow_tools/<mode>.json``) holds the rollout's turns per second (a
batch's turns over the wall time from its opening to its cut, summed over the run), the slots' mean
and longest wait at the boundary, the training wall time, and the win rate after on 128 held-out
seeds (the same seeds and delays in both modes), so the learning can be compared.

    python benchmarks/slow_tools.py run plain
    python benchmarks/slow_tools.py run stragglers
    python benchmarks/slow_tools.py table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sittings import Sittings, add_overrides, commit, figures, metric_records, num, training_wall  # noqa: E402

from verlog.config import load_config  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "slow_tools"
OUT = ROOT / "runs" / "slow_tools"
CONFIG = ROOT / "configs" / "cue_corridor.yaml"
GRAPH = [
    "multi_turn.langgraph.path=graphs/slow_tool_corridor.py",
    "multi_turn.langgraph.graph_kwargs.max_delay_s=4.0",
    "multi_turn.langgraph.graph_kwargs.slow_every=4",
]
MODES = {
    "plain": ["trainer.stragglers.enabled=false"],
    "stragglers": ["trainer.stragglers.enabled=true"],
    "stragglers+overlap": ["trainer.stragglers.enabled=true", "trainer.overlap.enabled=true"],
}


def run(mode: str, updates: int, seed: int, out: Path, results: Path, extra: list[str] | None = None) -> dict[str, Any]:
    """Train the slow-tool corridor for ``updates`` updates in ``mode``; write its result."""
    from rich.console import Console

    from verlog.train import train

    run_dir = out / mode / f"seed{seed}"
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"error: {run_dir} holds a run: remove it to run again")
    config = load_config(
        CONFIG,
        [
            *GRAPH,
            *MODES[mode],
            f"trainer.run_dir={run_dir}",
            f"trainer.total_updates={updates}",
            f"trainer.seed={seed}",
            f"rollout.seed={seed * 1_000_003}",
            "trainer.save_every=0",
            "eval.at_start=false",
            *(extra or []),
        ],
    )
    print(f"slow tools, {mode}, seed {seed}: {updates} updates", flush=True)
    sitting = Sittings(run_dir)
    result = train(config, console=Console(quiet=True))
    sittings = sitting.close()
    records = metric_records(run_dir)
    batches = [r for r in records if r["kind"] == "update"]
    # every batch holds num_envs x turns_per_env turns, in either mode
    turns = len(batches) * config.trainer.num_envs * config.trainer.turns_per_env
    rollout = sum(num(r["rollout_s"]) for r in batches)
    after = figures(result.eval_end[0].as_dict())
    summary = {
        "mode": mode,
        "seed": seed,
        "commit": commit(),
        "updates": result.updates,
        "env_steps": int(num(batches[-1]["turns_total"])),
        "turns_per_s": turns / rollout,
        "rollout_s_per_batch": rollout / len(batches),
        "boundary_wait_s": sum(num(r["boundary_wait_s"]) for r in batches) / len(batches),
        "boundary_wait_max_s": sum(num(r["boundary_wait_max_s"]) for r in batches) / len(batches),
        "slot_turns_min": min(num(r["slot_turns_min"]) for r in batches),
        "slot_turns_max": max(num(r["slot_turns_max"]) for r in batches),
        "staleness_mean": sum(num(r.get("staleness_mean", 0.0)) for r in batches) / len(batches),
        "stale_dropped_turns": sum(num(r.get("stale_dropped_turns", 0.0)) for r in batches),
        "training_wall_s": training_wall(records),
        "load": Sittings.load_of(sittings),
        "after": after,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{mode}.json").write_text(json.dumps(summary, indent=1))
    print(
        f"{mode}: {summary['turns_per_s']:.0f} turns/s in the rollout ({summary['rollout_s_per_batch']:.1f} s a batch), "
        f"slots waited {summary['boundary_wait_s']:.1f} s at the boundary (longest {summary['boundary_wait_max_s']:.1f}); "
        f"training {summary['training_wall_s'] / 60:.1f} min; win rate after {after['win_rate']:.3f} ± "
        f"{after['win_rate_se']:.3f}",
        flush=True,
    )
    return summary


def table(results: Path) -> str:
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    lines = [
        "| mode | env steps | rollout turns/s | s per batch | slots' wait at the boundary (mean / longest, s) | "
        "turns a slot gave (min-max) | training min | win rate after | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in rows.items():
        a = r["after"]
        lines.append(
            f"| {mode} | {r['env_steps']} | {r['turns_per_s']:.0f} | {r['rollout_s_per_batch']:.1f} | "
            f"{r['boundary_wait_s']:.1f} / {r['boundary_wait_max_s']:.1f} | "
            f"{r['slot_turns_min']:.0f}-{r['slot_turns_max']:.0f} | {r['training_wall_s'] / 60:.1f} | "
            f"{a['win_rate']:.3f} ± {a['win_rate_se']:.3f} | {r['load']['mean']:.1f} |"
        )
    if "plain" in rows:
        base = rows["plain"]
        for mode, r in rows.items():
            if mode == "plain":
                continue
            se = math.hypot(base["after"]["win_rate_se"], r["after"]["win_rate_se"])
            gap = (r["after"]["win_rate"] - base["after"]["win_rate"]) / se if se > 0 else 0.0
            lines.append(
                f"\n{mode} / plain: {r['turns_per_s'] / base['turns_per_s']:.1f}x the rollout's turns/s, "
                f"win rate {gap:+.1f} s.e."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train in one mode")
    p.add_argument("mode", choices=list(MODES))
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT)
    add_overrides(p)
    for parser_ in (p, sub.add_parser("table", help="the table from the result files")):
        parser_.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.mode, args.updates, args.seed, args.out, args.results, args.set)
    else:
        text = table(args.results)
        (args.results / "table.md").write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
