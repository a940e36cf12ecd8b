"""The advantage estimators side by side: the cue-corridor learning run for each, several seeds.

The random-init word-level toy model learns ``graphs/cue_corridor.py`` (reward only at the end of
the corridor) through ``verlog train`` with each estimator of ``verlog.algo.estimators``:
PPO with dual-discount GAE and a critic, GRPO, GiGPO, RLOO, REINFORCE++, REINFORCE++-baseline (no
critic), and the zero-advantage control, each with its published defaults (only GAE's advantages
are whitened over the batch; ``--whiten`` whitens every estimator's, the setting of the first table
in docs/algorithms.md). Every run uses the same batch shape (32 slots x 16 turns = 512 turns per
update; slots in groups of 8 play the same seeds, which the group estimators compare; 16 turns
per slot so that episodes, capped at 10 turns, complete inside a batch), validates on 64 held-out
seeds every 5 updates, stops at 0.95 validation success (or after ``--updates``), and is scored
before and after on 128 test seeds. Prints one table and writes ``<out>/estimators.json``; runs
already recorded there are not run again, so the table can be grown seed by seed.

    python benchmarks/estimators.py [--seeds 0 1 2] [--variants gae grpo gigpo rloo reinforce_pp
                                    reinforce_pp_baseline] [--updates 60] [--control-updates 30]
                                    [--whiten] [--out runs/estimators]

"updates to 0.9" is the first validation (every 5 updates) at >= 0.9 success; "train s" counts
rollout and update seconds (no evaluation), critic warm-up included.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.config import load_config  # noqa: E402
from verlog.train import train  # noqa: E402

#: the runs the table can hold: name -> (what the table calls it, overrides beyond the estimator)
VARIANTS = {
    "gae": ("PPO + dual-discount GAE", ["algorithm.estimator=gae"]),
    "grpo": ("GRPO", ["algorithm.estimator=grpo"]),
    # GiGPO's default normalization (verl-agent's mean_norm): group-centred, no std division
    "gigpo": ("GiGPO (group_norm: mean)", ["algorithm.estimator=gigpo", "algorithm.group_norm=mean"]),
    "gigpo_std": ("GiGPO (group_norm: mean_std)", ["algorithm.estimator=gigpo", "algorithm.group_norm=mean_std"]),
    "rloo": ("RLOO", ["algorithm.estimator=rloo"]),
    "reinforce_pp": ("REINFORCE++", ["algorithm.estimator=reinforce_pp"]),
    "reinforce_pp_baseline": ("REINFORCE++-baseline", ["algorithm.estimator=reinforce_pp_baseline"]),
    "zero": ("zero advantages (control)", ["algorithm.estimator=zero"]),
}
#: the batch shape every run shares
SHAPE = ["trainer.num_envs=32", "trainer.turns_per_env=16", "trainer.group_size=8"]


def run(out: Path, variant: str, seed: int, updates: int, stop: bool, whiten: bool = False) -> dict:
    """One training run; its held-out success before and after, and when validation reached 0.9.
    ``whiten``: every estimator's advantages whitened over the batch (else each one's default)."""
    run_dir = out / f"{variant}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        *SHAPE,
        *VARIANTS[variant][1],
        *(["algorithm.whiten_advantages=true"] if whiten else []),
        f"trainer.seed={seed}",
        f"rollout.seed={seed * 100_000}",
        f"trainer.total_updates={updates}",
        "trainer.eval_every=5",
        f"trainer.save_every={updates}",
        "eval.episodes=128",
        "eval.at_start=true",
    ]
    if stop:
        overrides.append("trainer.stop_at_win_rate=0.95")
    config = load_config(ROOT / "configs" / "cue_corridor.yaml", overrides)
    result = train(config, console=Console(quiet=True))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_s = sum(
        r.get("rollout_s", 0.0) + r.get("update_s", 0.0) for r in records if r["kind"] in ("update", "critic_warmup")
    )
    validations = [(r["update"], r["tasks"][0]["win_rate"]) for r in records if r["kind"] == "validation"]
    hit = next((u for u, w in validations if w >= 0.9), None)
    return {
        "variant": variant,
        "estimator": config.algorithm.estimator,
        "seed": seed,
        "updates": result.updates,
        "before": result.eval_start[0].win_rate,
        "after": result.eval_end[0].win_rate,
        "after_se": result.eval_end[0].win_rate_se,
        "updates_to_0.9": hit,
        "train_s": train_s,
        "validation": validations,
        "wall_s": result.seconds,
        "whiten_advantages": config.algorithm.whiten_advantages,
    }


def table(rows: list[dict]) -> str:
    """One line per variant: success before -> after (mean over seeds), updates to 0.9 per seed."""
    lines = [
        "| estimator | critic | seeds | success before | success after (mean, per seed) | updates to 0.9 (per seed) | train s (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    from verlog.algo.estimators import get_estimator

    present = dict.fromkeys(r["variant"] for r in rows)
    for variant in [v for v in VARIANTS if v in present]:
        mine = [r for r in rows if r["variant"] == variant]
        estimator = mine[0]["estimator"]
        before = statistics.mean(r["before"] for r in mine)
        after = statistics.mean(r["after"] for r in mine)
        per_seed = ", ".join(f"{r['after']:.2f}" for r in mine)
        hits = ", ".join("-" if r["updates_to_0.9"] is None else str(r["updates_to_0.9"]) for r in mine)
        critic = "yes" if get_estimator(estimator).needs_critic else "no"
        lines.append(
            f"| {VARIANTS[variant][0]} | {critic} | {len(mine)} | {before:.2f} | {after:.2f} ({per_seed}) | "
            f"{hits} | {statistics.mean(r['train_s'] for r in mine):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["gae", "grpo", "gigpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"],
        choices=list(VARIANTS),
        help="which runs (the zero control is added by --control-updates)",
    )
    parser.add_argument("--updates", type=int, default=60, help="most updates of a learning run")
    parser.add_argument(
        "--control-updates", type=int, default=30, help="updates of the zero-advantage control (0: skip)"
    )
    parser.add_argument("--control-seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--whiten",
        action="store_true",
        help="whiten every estimator's advantages over the batch (algorithm.whiten_advantages=true)",
    )
    parser.add_argument("--out", default=str(ROOT / "runs" / "estimators"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / "estimators.json"

    # runs already in <out>/estimators.json are kept, not run again (a table can grow seed by seed)
    rows: list[dict] = json.loads(results_file.read_text()) if results_file.exists() else []
    done = {(r["variant"], r["seed"]) for r in rows}
    plan = [(v, s, args.updates, True) for v in args.variants for s in args.seeds]
    if args.control_updates:
        plan += [("zero", s, args.control_updates, False) for s in args.control_seeds]
    for variant, seed, updates, stop in plan:
        if (variant, seed) in done:
            continue
        row = run(out, variant, seed, updates, stop, args.whiten)
        rows.append(row)
        results_file.write_text(json.dumps(rows, indent=1))  # what has run so far survives an interruption
        print(
            f"{variant} seed {seed}: {row['before']:.2f} -> {row['after']:.2f} in {row['updates']} updates "
            f"(0.9 at {row['updates_to_0.9']}), {row['train_s']:.0f} s training",
            flush=True,
        )
    print(table(rows))


if __name__ == "__main__":
    main()
