"""P17: a warm start that pays: supervised fine-tuning on demonstrations, then PPO (``verlog sft``,
``verlog train --init-from``), against imitation alone, PPO alone, the untrained policy and random
valid actions, on held-out levels whose contents training never played (verlog.envs.held_out).

Experiments (each a config of ``configs/``, which holds the recipe and says what it measures):

* ``goto``: SmolLM2-135M-Instruct on BALROG's BabyAI "go to" (``configs/babyai_warm_start.yaml``);
* ``mixed``: SmolLM2-135M-Instruct, one policy for BALROG's five BabyAI tasks
  (``configs/babyai_mixed_warm_start.yaml``), evaluated per task, BALROG's BabyAI average;
* ``sokoban``: ``sokoban-words`` on verl-agent's Sokoban (``configs/sokoban_warm_start.yaml``).

::

    python benchmarks/warm_start.py run goto --seed 0      # SFT (its evaluation: imitation alone), then PPO from it
    python benchmarks/warm_start.py run goto --seed 0 --ppo-only          # PPO from the untrained policy
    python benchmarks/warm_start.py baseline goto          # the untrained policy, random valid actions (5 seeds)
    python benchmarks/warm_start.py show                   # the table of docs/warm_start.md, and the curves

Each run resumes where it stopped (run it again); its result goes to
``benchmarks/results/warm_start/<experiment>/seed<S>.json`` with the wall times and the machine's load.
Training seed ``S`` changes the demonstration levels, the held-out split, the shuffles and the PPO
slots' levels; the held-out evaluation levels are the same for every row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sittings import Sittings, add_overrides, commit, metric_records, timed  # noqa: E402

from verlog.config import load_config  # noqa: E402

EXPERIMENTS = {
    "goto": ROOT / "configs" / "babyai_warm_start.yaml",
    "mixed": ROOT / "configs" / "babyai_mixed_warm_start.yaml",
    "sokoban": ROOT / "configs" / "sokoban_warm_start.yaml",
}
OUT = ROOT / "runs" / "warm_start"
RESULTS = ROOT / "benchmarks" / "results" / "warm_start"
#: how far apart the seeds of two training seeds' demonstration levels are
SEED_STRIDE = 100_000
#: player seeds of the random-valid-action baseline
RANDOM_SEEDS = 5


def _config(experiment: str, overrides: list[str]) -> Any:
    return load_config(EXPERIMENTS[experiment], ["wandb.mode=disabled", *overrides])


def _seeded(experiment: str, seed: int, out: Path, extra: list[str], *, ppo_only: bool = False) -> Any:
    """The experiment's config for training seed ``seed``: its own demonstration levels, split,
    shuffles, PPO slots' levels and run folders under ``out``."""
    base = _config(experiment, [])
    assert base.sft is not None
    sources = [
        {**d.model_dump(mode="json", exclude_none=True), "seed": d.seed + seed * SEED_STRIDE}
        for d in base.sft.demonstrations
    ]
    where = out / experiment / f"seed{seed}"
    overrides = [
        f"sft.run_dir={where / 'sft'}",
        f"sft.seed={seed}",
        f"sft.demonstrations={json.dumps(sources)}",
        f"trainer.run_dir={where / ('ppo_only' if ppo_only else 'ppo')}",
        f"trainer.seed={seed}",
        f"rollout.seed={base.rollout.seed + seed * SEED_STRIDE + SEED_STRIDE // 2}",
        *extra,
    ]
    return _config(experiment, overrides)


def _tasks(eval_json: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(eval_json.read_text())
    return {t["task"]: t for t in data["after"]}


def _balrog_average(tasks: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The mean of the tasks' win rates (BALROG's BabyAI score: each task's mean progression), with
    the standard error of that mean (the tasks' errors, independent)."""
    rates = [t["win_rate"] for t in tasks.values()]
    se = math.sqrt(sum(t["win_rate_se"] ** 2 for t in tasks.values())) / len(rates)
    return {
        "win_rate": sum(rates) / len(rates),
        "win_rate_se": se,
        "episodes": sum(t["episodes"] for t in tasks.values()),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """SFT then PPO (or PPO alone) for one training seed; the result file."""
    from rich.console import Console

    from verlog.sft import sft
    from verlog.train import train

    config = _seeded(args.experiment, args.seed, args.out, args.set, ppo_only=args.ppo_only)
    results = args.results / args.experiment
    results.mkdir(parents=True, exist_ok=True)
    name = f"seed{args.seed}" + ("_ppo_only" if args.ppo_only else "")
    out: dict[str, Any] = {"experiment": args.experiment, "seed": args.seed, "commit": commit(), "overrides": args.set}
    sft_dir = Path(config.sft.run_dir)
    if not args.ppo_only:
        if not (sft_dir / "eval.json").is_file():
            sitting = Sittings(sft_dir)
            print(f"{args.experiment} seed {args.seed}: supervised fine-tuning in {sft_dir}", flush=True)
            with CpuClock(sft_dir):
                sft(config, resume=(sft_dir / "config.yaml").is_file() and (sft_dir / "demonstrations").is_dir())
            sitting.close()
        records = metric_records(sft_dir)
        demos = {p.stem.replace(".counts", ""): _yaml(p) for p in (sft_dir / "demonstrations").glob("*.counts.yaml")}
        sittings = _sittings(sft_dir)
        out["sft"] = {
            "demonstrations": demos,
            "steps": max((r["update"] for r in records if r["kind"].startswith("sft")), default=0),
            "train_s": sum(s for r, s in timed(records) if r["kind"] in ("sft", "sft_epoch", "sft_critic")),
            "wall_s": sum(s["wall_s"] for s in sittings) if sittings else None,
            "cpu_s": CpuClock.read(sft_dir),
            "load": Sittings.load_of(sittings) if sittings else None,
            "epochs": [r for r in records if r["kind"] == "sft_epoch"],
            "after": _tasks(sft_dir / "eval.json"),
        }
    ppo_dir = Path(config.trainer.run_dir)
    if config.trainer.total_updates > 0 and not (ppo_dir / "eval.json").is_file():
        sitting = Sittings(ppo_dir)
        print(f"{args.experiment} seed {args.seed}: PPO in {ppo_dir}", flush=True)
        if not args.ppo_only:
            config.trainer.init_from = str(sft_dir)
        with CpuClock(ppo_dir):
            train(config, resume=(ppo_dir / "checkpoints" / "latest").is_file(), console=Console(quiet=False))
        sitting.close()
    if (ppo_dir / "eval.json").is_file():
        records = metric_records(ppo_dir)
        sittings = _sittings(ppo_dir)
        updates = [r for r in records if r["kind"] == "update"]
        out["ppo"] = {
            "updates": len(updates),
            "train_s": sum(s for r, s in timed(records) if r["kind"] in ("update", "critic_warmup")),
            "wall_s": sum(s["wall_s"] for s in sittings) if sittings else None,
            "cpu_s": CpuClock.read(ppo_dir),
            "load": Sittings.load_of(sittings) if sittings else None,
            "curve": [
                {k: r.get(k) for k in ("update", "win_rate", "episode_return", "episode_length", "turns_total")}
                for r in updates
            ],
            "after": _tasks(ppo_dir / "eval.json"),
        }
    (results / f"{name}.json").write_text(json.dumps(out, indent=1))
    print(show_one(out), flush=True)
    return out


def _sittings(run_dir: Path) -> list[dict[str, Any]]:
    """A stage's sittings (none recorded for a stage run by hand, with the config's own command)."""
    path = run_dir / "sittings.json"
    return json.loads(path.read_text()) if path.is_file() else []


class CpuClock:
    """The CPU seconds (user + system, every thread) this process spends in a stage, added to the
    stage's ``cpu.json`` (a resumed stage adds its sittings): the cost of a run whatever else the
    machine did meanwhile (wall time on a busy machine says little)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "cpu.json"

    def __enter__(self) -> "CpuClock":
        self.start = time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        earlier = json.loads(self.path.read_text())["cpu_s"] if self.path.is_file() else 0.0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"cpu_s": earlier + time.process_time() - self.start}))

    @staticmethod
    def read(run_dir: Path) -> float | None:
        path = run_dir / "cpu.json"
        return json.loads(path.read_text())["cpu_s"] if path.is_file() else None


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The untrained policy and random valid actions (``RANDOM_SEEDS`` player seeds) on the held-out
    levels of ``args.experiment``."""
    from verlog.agent import build_engine
    from verlog.evaluation import evaluate
    from verlog.evaluation.baseline import evaluate_random
    from verlog.models import load_tokenizer

    config = _config(args.experiment, args.set)
    results = args.results / args.experiment
    results.mkdir(parents=True, exist_ok=True)
    path = results / "baseline.json"
    # one file for both rows: a row measured on its own (--random-only, --untrained-only) keeps the other
    out: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"experiment": args.experiment}
    out["commit"] = commit()
    if not args.untrained_only:
        tick = time.perf_counter()
        players = []
        for seed in range(RANDOM_SEEDS):
            players.append({r.task: r.as_dict() for r in asyncio.run(evaluate_random(config, seed=seed))})
        out["random"] = {task: _pooled([p[task] for p in players]) for task in players[0]}
        out["random_s"] = time.perf_counter() - tick
        out["random_overrides"] = args.set
    if not args.random_only:
        tick = time.perf_counter()
        tokenizer = load_tokenizer(config.model.path)

        async def untrained() -> Any:
            engine = build_engine(config, tokenizer)
            try:
                return await evaluate(config, engine, tokenizer)
            finally:
                await engine.aclose()

        out["before"] = {r.task: r.as_dict() for r in asyncio.run(untrained())}
        out["before_s"] = time.perf_counter() - tick
        out["before_overrides"] = args.set
    path.write_text(json.dumps(out, indent=1))
    return out


def _pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several evaluations of the same levels as one: the mean win rate over all their episodes, its
    standard error over the players' means (each player's seed a sample)."""
    rates = [r["win_rate"] for r in results]
    mean = sum(rates) / len(rates)
    n = sum(r["episodes"] for r in results)
    between = math.sqrt(sum((x - mean) ** 2 for x in rates) / (len(rates) - 1) / len(rates)) if len(rates) > 1 else 0.0
    within = math.sqrt(mean * (1 - mean) / max(1, n - 1))
    return {
        "task": results[0]["task"],
        "episodes": n,
        "players": len(results),
        "win_rate": mean,
        "win_rate_se": max(between, within),
        "length_mean": sum(r["length_mean"] for r in results) / len(results),
        "per_player": rates,
    }


def show_one(out: dict[str, Any]) -> str:
    lines = [f"{out['experiment']} seed {out['seed']}:"]
    for stage in ("sft", "ppo"):
        if stage in out:
            for task, r in out[stage]["after"].items():
                lines.append(
                    f"  after {stage.upper()}: {task} {r['win_rate']:.3f} ± {r['win_rate_se']:.3f} "
                    f"({r['episodes']} episodes, length {r['length_mean']:.1f}); "
                    f"{(out[stage].get('wall_s') or float('nan')) / 60:.1f} min wall, "
                    f"{(out[stage].get('cpu_s') or float('nan')) / 60:.1f} CPU min"
                )
    return "\n".join(lines)


def pooled_rows(results: list[dict[str, Any]], stage: str) -> dict[str, dict[str, Any]]:
    """A stage's held-out results over the training seeds, by task: the win rate over all their
    episodes, with the standard error of a mean of independent episodes, and each seed's."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        for task, t in r.get(stage, {}).get("after", {}).items():
            by_task.setdefault(task, []).append(t)
    out = {}
    for task, runs in by_task.items():
        n = sum(t["episodes"] for t in runs)
        mean = sum(t["win_rate"] * t["episodes"] for t in runs) / n
        out[task] = {
            "win_rate": mean,
            "win_rate_se": math.sqrt(mean * (1 - mean) / max(1, n - 1)),
            "episodes": n,
            "seeds": [round(t["win_rate"], 3) for t in runs],
        }
    return out


def _seeds(n: int) -> str:
    return f"{n} training seed{'' if n == 1 else 's'}"


def table(folder: Path) -> list[str]:
    """The markdown rows of one experiment: random valid actions, the untrained policy, SFT alone,
    SFT + PPO and PPO alone, each task's held-out win rate (mean ± s.e.), with the BALROG average
    of several tasks."""
    base = json.loads((folder / "baseline.json").read_text()) if (folder / "baseline.json").is_file() else {}
    warm = [json.loads(p.read_text()) for p in sorted(folder.glob("seed*.json")) if "ppo_only" not in p.name]
    alone = [json.loads(p.read_text()) for p in sorted(folder.glob("seed*_ppo_only.json"))]
    players = [
        ("random valid actions", base.get("random"), f"{RANDOM_SEEDS} player seeds"),
        ("untrained", base.get("before"), "1 player"),
        ("SFT alone", pooled_rows(warm, "sft"), _seeds(len(warm))),
        ("SFT + PPO", pooled_rows(warm, "ppo"), _seeds(len(warm))),
        ("PPO alone", pooled_rows(alone, "ppo"), _seeds(len(alone))),
    ]
    rows = []
    for name, tasks, seeds in players:
        if not tasks:
            continue
        seeds += f", {next(iter(tasks.values()))['episodes']} episodes a task"
        cells = [f"{t['win_rate']:.3f} ± {t['win_rate_se']:.3f}" for t in tasks.values()]
        if len(tasks) > 1:
            avg = _balrog_average(tasks)
            cells.append(f"**{avg['win_rate']:.3f} ± {avg['win_rate_se']:.3f}**")
        per_seed = "; ".join(", ".join(map(str, t.get("seeds", []))) for t in tasks.values() if t.get("seeds"))
        rows.append(f"| {name} | {' | '.join(cells)} | {seeds} | {per_seed} |")
    header = list(next((t for _, t, _ in players if t), {}).keys())
    head = f"| player | {' | '.join(header)}{' | BALROG average' if len(header) > 1 else ''} | seeds | each seed |"
    return [head, "|" + "---|" * (head.count("|") - 1), *rows]


def curves(results: Path, out: Path) -> None:
    """The learning curves of every run: the SFT held-out loss by epoch, the PPO rollouts' win rate
    by update (one line a training seed), one row of panels per experiment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = [e for e in EXPERIMENTS if any((results / e).glob("seed*.json"))]
    fig, axes = plt.subplots(len(experiments), 2, figsize=(10, 3.2 * len(experiments)), squeeze=False)
    for row, experiment in zip(axes, experiments):
        for path in sorted((results / experiment).glob("seed*.json")):
            r = json.loads(path.read_text())
            label = path.stem
            if "sft" in r:
                epochs = r["sft"]["epochs"]
                row[0].plot(
                    [e["epoch"] for e in epochs], [e.get("held_out_loss") for e in epochs], marker="o", label=label
                )
            if "ppo" in r:
                curve = r["ppo"]["curve"]
                row[1].plot([c["update"] for c in curve], [c["win_rate"] for c in curve], label=label)
        row[0].set_title(f"{experiment}: SFT, held-out loss by epoch")
        row[1].set_title(f"{experiment}: PPO, rollouts' win rate by update")
        for ax in row:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def show(args: argparse.Namespace) -> str:
    """Every experiment's table (and the curves' picture beside the result files)."""
    lines = []
    for experiment in EXPERIMENTS:
        folder = args.results / experiment
        if folder.is_dir() and any(folder.glob("*.json")):
            lines += [f"### {experiment}", "", *table(folder), ""]
    if any(args.results.glob("*/seed*.json")):
        curves(args.results, args.results / "curves.png")
        lines.append(f"curves: {args.results / 'curves.png'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="SFT then PPO for one training seed (run again to resume)")
    p.add_argument("experiment", choices=list(EXPERIMENTS))
    p.add_argument("--seed", type=int, default=0, help="the training seed")
    p.add_argument("--ppo-only", action="store_true", help="PPO from the untrained policy (no warm start)")
    p.add_argument("--out", type=Path, default=OUT, help="where the run folders go")
    b = sub.add_parser("baseline", help="the untrained policy and random valid actions on the held-out levels")
    b.add_argument("experiment", choices=list(EXPERIMENTS))
    only = b.add_mutually_exclusive_group()
    only.add_argument("--random-only", action="store_true", help="random valid actions alone")
    only.add_argument("--untrained-only", action="store_true", help="the untrained policy alone")
    s = sub.add_parser("show", help="print the results")
    for q in (p, b, s):
        q.add_argument("--results", type=Path, default=RESULTS, help="where the result files go")
    for q in (p, b):
        add_overrides(q)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "baseline":
        print(json.dumps(baseline(args), indent=1))
    else:
        print(show(args), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
