"""P5d: a long-horizon game learned on the CPU, and which of Verlog's techniques earn their keep.

``crafter-words`` (a random-init word-level model, ``verlog/models/crafter_words.py``) learns Crafter
through ``graphs/crafter.py``, unchanged (verlog's Crafter text, episodes of up to 400 steps), with
``configs/crafter_words.yaml``: fixed-turn batches of 64 slots x 16 turns, so an episode of hundreds of
steps is cut by tens of batch boundaries and goes on after each update. Every row of the ablation table
trains for the same budget of environment steps (the critic pre-training's buffer included) and is
evaluated on the same 64 held-out worlds (``eval.seed`` 1000000 onwards, 400 steps each):

    a  Verlog's recipe: PPO, dual-discount GAE, critic pre-training, bootstrapped cuts
    b  (a) without critic pre-training
    c  (a) with one discount per token: a token-level PPO discounts every generated token, so across
       a turn of L answer tokens credit shrinks by gamma^(L+1) and lambda^(L+1); the model answers in
       one token, so answers of ``--answer-tokens`` (32) are emulated by those per-turn factors
    d  (a) with cut episodes treated as terminated (no bootstrap at the batch boundary or time limit)
    e  GRPO on whole episodes: no critic, groups of 8 slots replaying one world, 400 turns per slot
       and batch so that episodes end inside their batch
    e-gigpo  the same with GiGPO (step-level groups of identical observations)

Each run writes ``benchmarks/results/long_horizon/<row>/seed<k>.json`` (its run folder, with the
checkpoints, is ``runs/long_horizon/<row>/seed<k>``); ``table`` builds the table (mean ± s.e. across
training seeds) and the curves from whatever result files exist, so the runs can be spread over
several sittings (a killed run resumes from its last checkpoint: run the same command again).

    python benchmarks/long_horizon.py run a --seed 0        # item 1: before -> after (also row a)
    python benchmarks/long_horizon.py random                # random valid actions on the same worlds
    python benchmarks/long_horizon.py table                 # table.md, curves.png beside the result files
    python benchmarks/long_horizon.py run b --seed 1 --steps 49152   # any row, seed and budget

Scores count environment steps, never wall time; the wall time and the machine's load are recorded
beside them. Achievements per episode are Crafter's score (BALROG's progression x 22 / 100).
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

from sittings import MetricsTail, Sittings, add_overrides, commit, metric_records, num, timed, training_wall  # noqa: E402

from verlog.config import load_config  # noqa: E402
from verlog.evaluation.results import PROGRESSION_SCALE  # noqa: E402

CONFIG = ROOT / "configs" / "crafter_words.yaml"
OUT = ROOT / "runs" / "long_horizon"
#: the result files (small, kept in the repository so that the table grows over sittings and machines)
RESULTS = ROOT / "benchmarks" / "results" / "long_horizon"
#: Crafter's achievements: BALROG's progression is unlocked / ACHIEVEMENTS
ACHIEVEMENTS = 22
#: the environment-step budget of every row (the critic pre-training's buffer included)
DEFAULT_STEPS = 48_128  # 45 updates of 1,024 turns after a 2,048-step warm-up
GAMMA, LAM = 0.99, 0.95

_GROUP = [
    "critic_warmup.buffer_multiplier=0",
    "critic_warmup.iterations=0",
    "trainer.num_envs=16",
    "trainer.turns_per_env=400",
    "trainer.group_size=8",
    "algorithm.mini_batch_turns=1600",
]


def row_overrides(row: str, answer_tokens: int) -> list[str]:
    """The config overrides of an ablation row (on top of ``configs/crafter_words.yaml``)."""
    per_turn = answer_tokens + 1  # L answer tokens and the step bridge of dual-discount GAE
    rows = {
        "a": [],
        "b": ["critic_warmup.buffer_multiplier=0", "critic_warmup.iterations=0"],
        "c": [f"algorithm.gamma_step={GAMMA**per_turn:.6f}", f"algorithm.lam_step={LAM**per_turn:.6f}"],
        "d": ["algorithm.bootstrap_cuts=false"],
        "e": ["algorithm.estimator=grpo", *_GROUP],
        "e-gigpo": ["algorithm.estimator=gigpo", *_GROUP],
    }
    if row not in rows:
        raise SystemExit(f"error: unknown row {row!r}; one of {', '.join(rows)}")
    return rows[row]


ROW_NAMES = {
    "a": "Verlog's recipe (PPO, dual-discount GAE, critic pre-training, bootstrapped cuts)",
    "b": "without critic pre-training",
    "c": "one discount per token",
    "d": "cut episodes treated as terminated",
    "e": "GRPO on whole episodes",
    "e-gigpo": "GiGPO on whole episodes",
}


def scores(task: dict[str, Any]) -> dict[str, float]:
    """An evaluation's figures: achievements per episode, return and length (mean ± s.e.)."""
    scale = ACHIEVEMENTS / PROGRESSION_SCALE
    return {
        "episodes": task["episodes"],
        "achievements": task["progression"] * scale,
        "achievements_se": task["progression_se"] * scale,
        "return": task["return_mean"],
        "return_se": task["return_se"],
        "length": task["length_mean"],
    }


def played_steps(records: list[dict[str, Any]], budget: int) -> int:
    """The environment steps a run played (its last update's ``turns_total``, the warm-up's
    included); ``budget`` for records without the count."""
    updates = [r for r in records if r["kind"] == "update" and r.get("turns_total") is not None]
    return int(updates[-1]["turns_total"]) if updates else budget


def curve(records: list[dict[str, Any]], batch_turns: int, warmup_steps: int) -> list[dict[str, float]]:
    """Per update: environment steps so far and the figures of the training episodes that ended in it."""
    points = []
    for r in records:
        if r["kind"] != "update" or not r.get("episodes"):
            continue
        # the steps actually played (turns_total counts the warm-up's too): a batch of whole groups
        # (row e) holds fewer turns than its slots could give, while a slot waits for its group
        steps = r.get("turns_total", warmup_steps + r["update"] * batch_turns)
        points.append(
            {
                "update": r["update"],
                "env_steps": steps,
                "achievements": num(r.get("progression")) * ACHIEVEMENTS,
                "return": num(r["episode_return"]),
                "length": num(r["episode_length"]),
                "invalid": num(r.get("invalid_action_rate")),
                "elapsed_s": r["elapsed_s"],
                "seconds": r["rollout_s"] + r["update_s"],
            }
        )
    return points


def evaluations(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's evaluation before training (update 0) and its last one, from ``metrics.jsonl`` (which
    a resumed run appends to), and the seconds they took."""
    evals = [(r, seconds) for r, seconds in timed(records) if r["kind"] == "eval"]
    before = next((scores(r["tasks"][0]) for r, _ in evals if r["update"] == 0), None)
    after = next((scores(r["tasks"][0]) for r, _ in reversed(evals) if r["update"] > 0), None)
    return {"before": before, "after": after, "seconds": sum(seconds for _, seconds in evals)}


def run(
    row: str,
    seed: int,
    steps: int,
    out: Path,
    answer_tokens: int,
    before: bool,
    threads: int | None,
    extra: list[str] | None = None,
    results: Path = RESULTS,
) -> dict:
    """Train one row with one training seed for ``steps`` environment steps; write its result file."""
    from rich.console import Console

    from verlog.train import train

    run_dir = out / row / f"seed{seed}"
    overrides = [*row_overrides(row, answer_tokens), *(extra or [])]
    probe = load_config(CONFIG, overrides)
    batch_turns = probe.trainer.num_envs * probe.trainer.turns_per_env
    warmup_steps = probe.critic_warmup.buffer_multiplier * batch_turns
    updates = (steps - warmup_steps) // batch_turns
    if updates < 1:
        raise SystemExit(f"error: --steps {steps} is less than one batch ({batch_turns}) after the warm-up")
    grouped = probe.trainer.group_size > 1
    # a batch of whole groups holds fewer turns than its slots could give (a slot waits for its group):
    # such a row plays updates until its steps reach ``steps``, the full batches' count setting the checkpoint pace
    budget = steps if grouped else warmup_steps + updates * batch_turns
    ceiling = (steps - warmup_steps) // probe.trainer.num_envs if grouped else updates
    config = load_config(
        CONFIG,
        [
            *overrides,
            f"trainer.run_dir={run_dir}",
            "wandb.mode=disabled",
            f"trainer.total_updates={ceiling}",
            f"trainer.stop_at_env_steps={budget}",
            f"trainer.seed={seed}",
            f"rollout.seed={seed * 1_000_003}",
            f"trainer.save_every={max(1, updates // 6)}",
            f"eval.at_start={str(before).lower()}",
            *([f"trainer.torch_threads={threads}"] if threads else []),
        ],
    )
    resume = (run_dir / "metrics.jsonl").is_file()
    print(
        f"row {row} ({ROW_NAMES[row]}), seed {seed}: {updates} updates x {batch_turns} turns "
        f"+ {warmup_steps} warm-up steps = {budget} environment steps"
        f"{'' if ceiling == updates else ' (whole groups: until the steps played reach it)'}"
        f"{' (resuming)' if resume else ''}",
        flush=True,
    )
    watcher = MetricsTail(run_dir / "metrics.jsonl", _progress_line(ceiling))
    sitting = Sittings(run_dir)  # a run may take several sittings (killed, then resumed)
    train(config, resume=resume, console=Console(quiet=True))
    watcher.stop()
    sittings = sitting.close()
    records = metric_records(run_dir)
    points = curve(records, batch_turns, warmup_steps)
    evals = evaluations(records)
    wall = sum(s["wall_s"] for s in sittings)
    summary = {
        "row": row,
        "name": ROW_NAMES[row],
        "seed": seed,
        "commit": sittings[0]["commit"] if sittings else commit(),  # the code it trained with: its first sitting's
        "overrides": overrides,
        "env_steps": played_steps(records, budget),
        "budget_steps": budget,
        "warmup_steps": warmup_steps,
        "updates": max((r["update"] for r in records if r["kind"] == "update"), default=0),
        "batch_turns": batch_turns,
        "wall_s": wall,
        "train_s": sum(p["seconds"] for p in points),
        "sittings": sittings,
        "load": Sittings.load_of(sittings),
        "training_wall_s": training_wall(records),
        "eval_s": evals["seconds"],
        "seconds_per_update": sum(p["seconds"] for p in points) / max(1, len(points)),
        "before": evals["before"],
        "after": evals["after"],
        "curve": points,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (results / row).mkdir(parents=True, exist_ok=True)
    (results / row / f"seed{seed}.json").write_text(json.dumps(summary, indent=1))
    _print_result(summary)
    return summary


def _progress_line(total: int) -> Any:
    """How a record of ``metrics.jsonl`` is shown while a row trains."""

    def line_of(r: dict[str, Any]) -> str:
        if r["kind"] != "update":
            return f"  {r['kind']} at update {r['update']} ({r['elapsed_s']:.0f} s)"
        ach = num(r.get("progression")) * ACHIEVEMENTS
        return (
            f"  update {r['update']}/{total}: {r['episodes']:.0f} episodes ended, "
            f"achievements {ach:.2f}, return {num(r['episode_return']):.2f}, "
            f"length {num(r['episode_length']):.0f}, invalid {num(r['invalid_action_rate']):.2f}, "
            f"v_loss {num(r.get('value_loss')):.3f}, {r['rollout_s']:.0f}+{r['update_s']:.0f} s"
        )

    return line_of


def _fmt(d: dict[str, float] | None, key: str) -> str:
    return "—" if d is None else f"{d[key]:.2f} ± {d[key + '_se']:.2f}"


def _print_result(s: dict) -> None:
    print(
        f"row {s['row']} seed {s['seed']}: {s['env_steps']} steps, {s['training_wall_s'] / 60:.1f} min of training, "
        f"{s['wall_s'] / 60:.1f} min wall in all "
        f"({s['seconds_per_update']:.0f} s per update, load {s['load']['mean']:.1f})"
    )
    for name in ("before", "after"):
        if s.get(name):
            print(
                f"  {name:6s} achievements {_fmt(s[name], 'achievements')}, return {_fmt(s[name], 'return')}, "
                f"length {s[name]['length']:.0f}"
            )


def random_baseline(results: Path, extra: list[str] | None = None) -> dict:
    """Random valid actions on the held-out worlds the runs are evaluated on; ``<out>/random.json``."""
    from verlog.evaluation.baseline import evaluate_random

    config = load_config(CONFIG, extra or [])
    started = time.perf_counter()
    task = asyncio.run(evaluate_random(config, seed=0))[0].as_dict()
    summary = {"random": scores(task), "seconds": time.perf_counter() - started, "commit": commit()}
    results.mkdir(parents=True, exist_ok=True)
    (results / "random.json").write_text(json.dumps(summary, indent=1))
    r = summary["random"]
    print(
        f"random valid actions: achievements {_fmt(r, 'achievements')}, return {_fmt(r, 'return')}, "
        f"length {r['length']:.0f} ({r['episodes']} worlds)"
    )
    return summary


def _across(values: list[float], digits: int = 2) -> str:
    """The mean over training seeds ± its standard error, from the sample standard deviation (n - 1:
    with two or three seeds, BALROG's divisor n, right for 64 episodes, would understate it)."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    m = sum(values) / len(values)
    se = math.sqrt(sum((x - m) ** 2 for x in values) / (len(values) - 1) / len(values))
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def turns_per_update(result: dict[str, Any]) -> float:
    """The turns an update of a run trained on: its steps after the critic warm-up over its updates
    (a batch of whole groups holds fewer than its slots could give; files without ``warmup_steps``
    are of fixed-turn rows, whose every batch was full)."""
    warmup = result.get("warmup_steps", result["env_steps"] - result["updates"] * result["batch_turns"])
    return (result["env_steps"] - warmup) / max(1, result["updates"])


def table(results_dir: Path) -> str:
    """The ablation table (``table.md``) and ``curves.png`` from every result file in ``results_dir``."""
    results: dict[str, list[dict]] = {}
    for path in sorted(results_dir.glob("*/seed*.json")):
        r = json.loads(path.read_text())
        results.setdefault(r["row"], []).append(r)
    lines = []
    random_path = results_dir / "random.json"
    if random_path.is_file():
        r = json.loads(random_path.read_text())["random"]
        lines.append(
            f"Random valid actions: achievements {_fmt(r, 'achievements')}, return {_fmt(r, 'return')}, "
            f"length {r['length']:.0f} ({r['episodes']} held-out worlds).\n"
        )
    lines += [
        "| row | what | seeds | env steps | achievements | return | length | turns per update | s per update "
        "| training min (load) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in ROW_NAMES:
        runs = results.get(row)
        if not runs:
            continue
        after = [r["after"] for r in runs]
        one = len(runs) == 1  # one seed: the evaluation's own s.e. over worlds
        ach = _fmt(after[0], "achievements") if one else _across([a["achievements"] for a in after])
        ret = _fmt(after[0], "return") if one else _across([a["return"] for a in after])
        lines.append(
            f"| {row} | {ROW_NAMES[row]} | {len(runs)} | {runs[0]['env_steps']:,} | {ach} | {ret} | "
            f"{_across([a['length'] for a in after])} | {_across([turns_per_update(r) for r in runs])} | "
            f"{_across([r['seconds_per_update'] for r in runs])} | "
            f"{_across([r['training_wall_s'] / 60 for r in runs])} ({_across([r['load']['mean'] for r in runs])}) |"
        )
    before = next((r["before"] for rs in results.values() for r in rs if r.get("before")), None)
    if before:
        lines.append(
            f"\nBefore training: achievements {_fmt(before, 'achievements')}, return {_fmt(before, 'return')}, "
            f"length {before['length']:.0f}."
        )
    lines.append(
        "\nOne seed: ± is the s.e. over the 64 held-out worlds; several seeds: the s.e. of the mean across seeds "
        "(sample standard deviation)."
    )
    text = "\n".join(lines) + "\n"
    (results_dir / "table.md").write_text(text)
    _plot(
        results,
        results_dir / "curves.png",
        json.loads(random_path.read_text())["random"] if random_path.is_file() else None,
    )
    return text


def _plot(results: dict[str, list[dict]], path: Path, random: dict[str, float] | None) -> None:
    if not results:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    for row, runs in results.items():
        for i, r in enumerate(runs):
            xs = [p["env_steps"] for p in r["curve"]]
            for ax, key in zip(axes, ("achievements", "length")):
                ax.plot(
                    xs,
                    [p[key] for p in r["curve"]],
                    color=f"C{list(ROW_NAMES).index(row)}",
                    alpha=0.8,
                    label=f"{row}: {ROW_NAMES[row]}" if i == 0 and key == "achievements" else None,
                )
            for name, marker in (("before", "v"), ("after", "o")):
                if r.get(name):
                    x = 0 if name == "before" else r["env_steps"]
                    axes[0].errorbar(
                        [x],
                        [r[name]["achievements"]],
                        yerr=[r[name]["achievements_se"]],
                        fmt=marker,
                        color=f"C{list(ROW_NAMES).index(row)}",
                        capsize=3,
                        label=f"{row}: held-out worlds, {name}" if i == 0 else None,
                    )
    if random is not None:
        axes[0].axhline(random["achievements"], color="grey", linestyle="--", label="random valid actions (held out)")
        axes[1].axhline(random["length"], color="grey", linestyle="--")
    axes[0].set_ylabel("achievements per episode")
    axes[1].set_ylabel("length of training episodes (steps)")
    for ax in axes:
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
    axes[0].legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2
    )  # below: the curves stay in view
    fig.suptitle("Crafter from scratch on the CPU (crafter-words, graphs/crafter.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train one row with one training seed")
    p.add_argument("row", choices=list(ROW_NAMES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="environment-step budget")
    p.add_argument("--answer-tokens", type=int, default=32, help="row c: the answer length emulated")
    p.add_argument("--before", action="store_true", help="also evaluate the initial policy (default for row a seed 0)")
    p.add_argument("--threads", type=int, default=None, help="trainer.torch_threads")
    q = sub.add_parser("random", help="random valid actions on the held-out worlds")
    for parser_ in (p, q):
        add_overrides(parser_)
    p.add_argument("--out", type=Path, default=OUT, help="where the run folders go (checkpoints, metrics)")
    for parser_ in (p, q, sub.add_parser("table", help="the table and curves from the result files")):
        parser_.add_argument("--results", type=Path, default=RESULTS, help="where the result files go")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(
            args.row,
            args.seed,
            args.steps,
            args.out,
            args.answer_tokens,
            args.before or (args.row == "a" and args.seed == 0),
            args.threads,
            args.set,
            args.results,
        )
    elif args.command == "random":
        random_baseline(args.results, args.set)
    else:
        print(table(args.results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
