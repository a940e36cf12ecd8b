"""P5e: a pretrained LLM improved on a BALROG game on the CPU, and where an update's seconds go.

SmolLM2-135M-Instruct (the offline ``smollm2``) plays BALROG's BabyAI "go to" through
``graphs/babyai.py`` and trains with Verlog's recipe (``configs/babyai_smollm2.yaml``: PPO,
dual-discount GAE, critic pre-training). The run evaluates the sampled policy on 128 held-out levels
before and after training; random valid actions play the same levels. The result file
(``benchmarks/results/pretrained_babyai/result.json``) holds the win rates (mean ± s.e.), the
differences in standard errors, the seconds per update and where they went (rollout, the frozen
trunk's pass, logprob and value passes, actor and critic training), the wall times and the machine's load.

    python benchmarks/pretrained_babyai.py run                  # train, evaluate, compare (resumes if killed)
    python benchmarks/pretrained_babyai.py run --updates 20 --set actor.lr=2e-5
    python benchmarks/pretrained_babyai.py show                 # the result file, as a table

Scores count updates, never wall time; the wall time and the load are recorded beside them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sittings import comparison_main, comparison_rows, num, train_and_compare  # noqa: E402

from verlog.config import load_config  # noqa: E402

CONFIG = ROOT / "configs" / "babyai_smollm2.yaml"
OUT = ROOT / "runs" / "pretrained_babyai"
RESULTS = ROOT / "benchmarks" / "results" / "pretrained_babyai"
#: where an update's seconds go (``metrics.jsonl`` keys; ``update_s`` holds the last four)
PHASES = ("rollout_s", "trunk_s", "logprob_s", "value_s", "actor_s", "critic_s")


def profile(records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per update, in all and per phase (what the update's keys do not name is
    bookkeeping: advantages, copying, the optimizer's bookkeeping)."""
    updates = [r for r in records if r["kind"] == "update"]
    out = {key: sum(num(r.get(key, 0.0)) for r in updates) / max(1, len(updates)) for key in (*PHASES, "update_s")}
    out["total_s"] = out["rollout_s"] + out["update_s"]
    out["other_s"] = out["update_s"] - sum(out[k] for k in PHASES[1:])
    out["turns_per_s"] = sum(num(r["turns_per_s"]) for r in updates) / max(1, len(updates))
    return out


def _line(total: int) -> Any:
    def line_of(r: dict[str, Any]) -> str | None:
        if r["kind"] != "update":
            return f"  {r['kind']} {r['update']} ({r['elapsed_s']:.0f} s)"
        parts = " ".join(f"{k[:-2]} {num(r.get(k, 0.0)):.0f}" for k in PHASES)
        return (
            f"  update {r['update']}/{total}: win {num(r.get('win_rate')):.2f}, "
            f"return {num(r.get('episode_return')):.2f}, len {num(r.get('episode_length')):.1f}, "
            f"v_loss {num(r.get('value_loss')):.3f}, kl {num(r.get('approx_kl')):.4f}; s: {parts}"
        )

    return line_of


def run(updates: int | None, out: Path, results: Path, extra: list[str]) -> dict[str, Any]:
    """Train (or resume) the recipe, with the before/after evaluations; random valid actions on the
    same levels; write the result file."""
    run_dir = out / "run"
    overrides = [*([f"trainer.total_updates={updates}"] if updates else []), *extra]
    config = load_config(CONFIG, [f"trainer.run_dir={run_dir}", "wandb.mode=disabled", *overrides])
    total = config.trainer.total_updates
    resume = (run_dir / "metrics.jsonl").is_file()
    print(
        f"SmolLM2-135M on BabyAI go to: {total} updates x {config.trainer.num_envs * config.trainer.turns_per_env} "
        f"turns{' (resuming)' if resume else ''}",
        flush=True,
    )
    records, compared = train_and_compare(config, _line(total))
    summary = {
        "overrides": overrides,
        "updates": total,
        "batch_turns": config.trainer.num_envs * config.trainer.turns_per_env,
        **compared,
        "seconds_per_update": profile(records),
        "curve": [
            {
                "update": r["update"],
                "win_rate": num(r.get("win_rate")),
                "return": num(r.get("episode_return")),
                "length": num(r.get("episode_length")),
            }
            for r in records
            if r["kind"] == "update"
        ],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "result.json").write_text(json.dumps(summary, indent=1))
    print(show(summary), end="")
    return summary


def show(s: dict[str, Any]) -> str:
    """The result as a markdown table and a profile of an update."""

    def cell(d: dict[str, float]) -> str:
        return f"{d['win_rate']:.3f} ± {d['win_rate_se']:.3f} | {d['length']:.1f}"

    p = s["seconds_per_update"]
    lines = [
        "| player (128 held-out levels) | win rate | steps per game |",
        "|---|---|---|",
        *comparison_rows(s, "random valid actions", cell),
        f"training {s['training_wall_s'] / 60:.1f} min (critic pre-training included), evaluations "
        f"{s['eval_s'] / 60:.1f} min, random baseline {s['random_s'] / 60:.1f} min; load {s['load']['mean']:.1f} "
        f"(max {s['load']['max']:.1f}); commit {s['commit']}",
        f"seconds per update: {p['total_s']:.1f} = rollout {p['rollout_s']:.1f} ({p['turns_per_s']:.1f} turns/s) "
        f"+ frozen trunk {p['trunk_s']:.1f} + old logprobs {p['logprob_s']:.1f} + values {p['value_s']:.1f} + actor {p['actor_s']:.1f} "
        f"+ critic {p['critic_s']:.1f} + other {p['other_s']:.1f}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return comparison_main(
        argv,
        description=__doc__.splitlines()[0],
        script="benchmarks/pretrained_babyai.py",
        out=OUT,
        results=RESULTS,
        run=lambda a: run(a.updates, a.out, a.results, a.set),
        show=show,
    )


if __name__ == "__main__":
    sys.exit(main())
