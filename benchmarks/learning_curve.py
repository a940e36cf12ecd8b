"""P5: the CPU learning curve of verlog's full path, and its time to 0.9 success.

The random-init word-level toy model learns ``graphs/cue_corridor.py`` (delayed reward) through
``verlog train`` (graph -> recorder -> fixed-turn batches -> critic pre-training -> PPO). Held-out
episodes are evaluated every few updates; the same run with zeroed advantages is the control.
Writes ``<out>/learning_curve.png`` and ``<out>/learning_curve.json`` and prints the figures.

    python benchmarks/learning_curve.py [--updates 60] [--eval-every 5] [--no-control] [--out runs/bench]

Training time counts rollout and update seconds only (not evaluation); wall time counts all.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.config import load_config  # noqa: E402
from verlog.train import train  # noqa: E402


def run(out: Path, name: str, updates: int, eval_every: int, *extra: str) -> dict:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [
            f"trainer.run_dir={run_dir}",
            "wandb.mode=disabled",
            f"trainer.total_updates={updates}",
            f"trainer.eval_every={eval_every}",
            "eval.episodes=64",
            f"trainer.save_every={updates}",
            *extra,
        ],
    )
    result = train(config, console=Console(quiet=True))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_s, by_update = 0.0, {0: 0.0}
    warmup_s = sum(r.get("rollout_s", 0.0) for r in records if r["kind"] == "critic_warmup")
    for r in records:
        if r["kind"] == "update":
            train_s += r["rollout_s"] + r["update_s"]
            by_update[r["update"]] = train_s
    curve = [
        {
            "update": r["update"],
            "win_rate": r["tasks"][0]["win_rate"],
            "train_s": warmup_s + by_update.get(r["update"], 0.0),
            "wall_s": r["elapsed_s"],
        }
        for r in records
        if r["kind"] in ("eval", "validation")
    ]
    batch_win = [
        (r["update"], r["win_rate"]) for r in records if r["kind"] == "update" and r.get("win_rate") is not None
    ]
    return {"name": name, "curve": curve, "batch_win_rate": batch_win, "seconds": result.seconds}


def time_to(curve: list[dict], target: float) -> dict | None:
    return next((p for p in curve if p["win_rate"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--no-control", action="store_true", help="skip the zero-advantage control run")
    parser.add_argument("--out", default=str(ROOT / "runs" / "learning_curve"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    runs = [run(out, "ppo", args.updates, args.eval_every, "eval.at_start=true")]
    if not args.no_control:
        runs.append(
            run(out, "zero_advantages", args.updates, args.eval_every, "eval.at_start=true", "algorithm.estimator=zero")
        )
    (out / "learning_curve.json").write_text(json.dumps(runs, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        label = "PPO (dual-discount GAE)" if r["name"] == "ppo" else "advantages zeroed"
        by_update.plot([p["update"] for p in r["curve"]], [p["win_rate"] for p in r["curve"]], marker="o", label=label)
        by_time.plot([p["train_s"] for p in r["curve"]], [p["win_rate"] for p in r["curve"]], marker="o", label=label)
    for ax, xlabel in ((by_update, "PPO update (64 slots x 8 turns)"), (by_time, "training seconds (2 CPU cores)")):
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("success on held-out seeds")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(loc="upper left")
    fig.suptitle("cue corridor, random-init toy model, full verlog path")
    fig.tight_layout()
    png = out / "learning_curve.png"
    fig.savefig(png, dpi=120)

    ppo = runs[0]
    hit = time_to(ppo["curve"], 0.9)
    final = ppo["curve"][-1]
    print(f"success {ppo['curve'][0]['win_rate']:.3f} -> {final['win_rate']:.3f} after {final['update']} updates")
    if hit:
        print(
            f"time to 0.9: update {hit['update']}, {hit['train_s']:.0f} s of training "
            f"({hit['wall_s']:.0f} s wall clock with evaluations) -- target <= 300 s"
        )
    else:
        print("time to 0.9: not reached")
    if len(runs) > 1:
        print(
            f"advantages zeroed: success {runs[1]['curve'][-1]['win_rate']:.3f} after {runs[1]['curve'][-1]['update']} updates"
        )
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
