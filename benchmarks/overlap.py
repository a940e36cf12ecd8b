"""Alternating vs overlapped updates (``trainer.overlap``) at the same environment steps.

Two recipes, each trained alternating (``sync``: the slots wait while an update trains) and
overlapped (``overlap``: the slots play the next batch meanwhile, staleness bound 1, decoupled PPO):

* ``quickstart`` — ``make run``'s config (``configs/quickstart.yaml``: BabyAI "go to", 32 updates of
  512 turns), its final evaluation on the same 128 held-out levels;
* ``crafter`` — the Crafter recipe of ``benchmarks/long_horizon.py`` (row a, ``configs/crafter_words.yaml``),
  ``--steps`` environment steps, evaluated on the same 64 held-out worlds.

Each run writes ``benchmarks/results/overlap/<recipe>/<mode>/seed<k>.json``: its training wall time
(critic pre-training and updates; evaluations left out, identical in both modes), the score after,
what an update spent (rollout, update, each side's wait for the other) and the staleness figures.
``table`` prints the wall-time ratio overlapped / alternating per training seed and the scores.

    python benchmarks/overlap.py run quickstart --mode sync --seed 0
    python benchmarks/overlap.py run quickstart --mode overlap --seed 0
    python benchmarks/overlap.py run crafter --mode overlap --seed 1 --steps 10240
    python benchmarks/overlap.py table

Scores count environment steps; wall times are only comparable from one machine and load: each
result records the machine's load while it ran.
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

import long_horizon  # noqa: E402
from sittings import Sittings, add_overrides, commit, figures, metric_records, num, training_wall  # noqa: E402

from verlog.config import load_config  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "overlap"
OUT = ROOT / "runs" / "overlap"
MODES = {
    "sync": ["trainer.overlap.enabled=false"],
    "overlap": ["trainer.overlap.enabled=true", "trainer.overlap.max_staleness=1"],
}
#: the per-update figures averaged in a result
PER_UPDATE = (
    "rollout_s",
    "update_s",
    "trainer_wait_s",
    "rollout_wait_s",
    "staleness_mean",
    "off_policy_turns",
    "behaviour_weight",
    "behaviour_weight_truncated",
)


def _per_update(records: list[dict[str, Any]]) -> dict[str, float]:
    updates = [r for r in records if r["kind"] == "update"]
    out = {}
    for key in PER_UPDATE:
        values = [num(r[key]) for r in updates if key in r]
        out[key] = sum(values) / len(values) if values else float("nan")
    return out


#: recipes trained whole by ``verlog train`` (crafter goes through long_horizon.py): config, overrides
RECIPES = {
    "quickstart": ("quickstart.yaml", []),
    # a pretrained model whose update is large matrix products (they leave the interpreter free for the
    # rollout): SmolLM2-135M on BabyAI with its last 4 layers trained, a short run (the wall-time ratio)
    "smollm2": (
        "babyai_smollm2.yaml",
        [
            "trainer.total_updates=4",
            "critic_warmup.buffer_multiplier=1",
            "critic_warmup.iterations=1",
            "eval.episodes=32",
            "trainer.save_every=0",
        ],
    ),
}


def run_recipe(
    recipe: str, mode: str, seed: int, out: Path, results: Path, extra: list[str] | None = None
) -> dict[str, Any]:
    """A whole ``verlog train`` run of ``recipe`` with one training seed, alternating or overlapped."""
    from rich.console import Console

    from verlog.train import train

    run_dir = out / recipe / mode / f"seed{seed}"
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"error: {run_dir} holds a run: remove it to run again")
    config_file, recipe_overrides = RECIPES[recipe]
    config = load_config(
        ROOT / "configs" / config_file,
        [
            *recipe_overrides,
            *MODES[mode],
            f"trainer.run_dir={run_dir}",
            "wandb.mode=disabled",
            f"trainer.seed={seed}",
            f"rollout.seed={seed * 1_000_003}",
            "eval.at_start=false",
            *(extra or []),
        ],
    )
    print(f"{recipe}, {mode}, seed {seed}: {config.trainer.total_updates} updates", flush=True)
    sitting = Sittings(run_dir)
    started = time.perf_counter()
    result = train(config, console=Console(quiet=True))
    wall = time.perf_counter() - started
    sittings = sitting.close()
    records = metric_records(run_dir)
    after = figures(result.eval_end[0].as_dict()) if result.eval_end else None
    summary = {
        "recipe": recipe,
        "mode": mode,
        "seed": seed,
        "commit": commit(),
        "env_steps": int(max(r.get("turns_total", 0) for r in records if r["kind"] == "update")),
        "updates": result.updates,
        "wall_s": wall,
        "training_wall_s": training_wall(records),
        "load": Sittings.load_of(sittings),
        "after": after,
        "score": after["win_rate"] if after else None,
        "score_se": after["win_rate_se"] if after else None,
        "score_name": "win rate",
        **_per_update(records),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return _write(summary, results)


def run_crafter(
    mode: str, seed: int, steps: int, out: Path, results: Path, extra: list[str] | None = None
) -> dict[str, Any]:
    """The Crafter recipe (``long_horizon.py`` row a) for ``steps`` environment steps."""
    folder = results / "crafter" / mode
    s = long_horizon.run(
        "a", seed, steps, out / "crafter" / mode, 32, False, None, [*MODES[mode], *(extra or [])], folder
    )
    records = metric_records(out / "crafter" / mode / "a" / f"seed{seed}")
    summary = {
        "recipe": "crafter",
        "mode": mode,
        "seed": seed,
        "commit": s["commit"],
        "env_steps": s["env_steps"],
        "updates": s["updates"],
        "wall_s": s["wall_s"],
        "training_wall_s": s["training_wall_s"],
        "load": s["load"],
        "after": s["after"],
        "score": s["after"]["achievements"] if s["after"] else None,
        "score_se": s["after"]["achievements_se"] if s["after"] else None,
        "score_name": "achievements",
        **_per_update(records),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (folder / "a" / f"seed{seed}.json").unlink(missing_ok=True)  # long_horizon's own copy
    return _write(summary, results)


def _write(summary: dict[str, Any], results: Path) -> dict[str, Any]:
    folder = results / summary["recipe"] / summary["mode"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed{summary['seed']}.json").write_text(json.dumps(summary, indent=1))
    print(
        f"{summary['recipe']} {summary['mode']} seed {summary['seed']}: {summary['env_steps']} steps, "
        f"training {summary['training_wall_s'] / 60:.1f} min (load {summary['load']['mean']:.1f}), "
        f"{summary['score_name']} {summary['score']:.3f} ± {summary['score_se']:.3f}; per update: rollout "
        f"{summary['rollout_s']:.1f} s, update {summary['update_s']:.1f} s, trainer waited {summary['trainer_wait_s']:.1f} s, "
        f"rollout waited {summary['rollout_wait_s']:.1f} s",
        flush=True,
    )
    return summary


def table(results: Path) -> str:
    """Per recipe: each mode's training wall time and score per seed, the wall-time ratio
    overlapped / alternating of each seed, and the score gap in standard errors."""
    lines = [
        "| recipe | seed | env steps | sync: training min | overlapped: training min | ratio | sync score | "
        "overlapped score | gap (s.e.) | load sync / overlapped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        runs = {
            mode: {int(f.stem[4:]): json.loads(f.read_text()) for f in (recipe_dir / mode).glob("seed*.json")}
            for mode in MODES
        }
        ratios, gaps = [], []
        for seed in sorted(set(runs["sync"]) & set(runs["overlap"])):
            a, b = runs["sync"][seed], runs["overlap"][seed]
            ratio = b["training_wall_s"] / a["training_wall_s"]
            se = math.hypot(a["score_se"], b["score_se"])
            g = (b["score"] - a["score"]) / se if se > 0 else 0.0
            ratios.append(ratio)
            gaps.append(g)
            lines.append(
                f"| {recipe_dir.name} | {seed} | {b['env_steps']} | {a['training_wall_s'] / 60:.1f} | "
                f"{b['training_wall_s'] / 60:.1f} | {ratio:.2f} | {a['score']:.3f} ± {a['score_se']:.3f} | "
                f"{b['score']:.3f} ± {b['score_se']:.3f} | {g:+.1f} | {a['load']['mean']:.1f} / {b['load']['mean']:.1f} |"
            )
        if ratios:
            lines.append(
                f"| {recipe_dir.name} | mean | | | | {long_horizon._across(ratios, 3)} | "
                f"{long_horizon._across([runs['sync'][s]['score'] for s in sorted(runs['sync'])], 3)} | "
                f"{long_horizon._across([runs['overlap'][s]['score'] for s in sorted(runs['overlap'])], 3)} | "
                f"{sum(gaps) / len(gaps):+.1f} | |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train one recipe in one mode with one training seed")
    p.add_argument("recipe", choices=[*RECIPES, "crafter"])
    p.add_argument("--mode", choices=list(MODES), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10_240, help="crafter: the environment-step budget")
    p.add_argument("--out", type=Path, default=OUT, help="where the run folders go")
    add_overrides(p)
    for parser_ in (p, sub.add_parser("table", help="the comparison table from the result files")):
        parser_.add_argument("--results", type=Path, default=RESULTS, help="where the result files go")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.recipe in RECIPES:
            run_recipe(args.recipe, args.mode, args.seed, args.out, args.results, args.set)
        else:
            run_crafter(args.mode, args.seed, args.steps, args.out, args.results, args.set)
    else:
        text = table(args.results)
        (args.results / "table.md").write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
