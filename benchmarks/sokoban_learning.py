"""Issue 36: a small model learning Sokoban's text version from scratch on the CPU.

``sokoban-words`` (a random-init word-level model, ``verlog/models/sokoban_words.py``) learns
verl-agent's Sokoban (6x6 rooms, one box, 15 moves) through ``graphs/sokoban.py``, unchanged, with
Verlog's recipe (``configs/sokoban_words.yaml``: PPO, dual-discount GAE, critic pre-training,
fixed-turn batches). The run evaluates the sampled policy on the held-out rooms (verl-agent's
validation seeds, 65536 onwards; 128 of them) before and after training; random valid moves play
the same rooms. The result file (``benchmarks/results/sokoban_learning/result.json``) holds the
success rates (mean ± s.e.), the differences in standard errors, the curve of the training
episodes, the seconds per update, the wall times and the machine's load.

    python benchmarks/sokoban_learning.py run                   # train, evaluate, compare (resumes if killed)
    python benchmarks/sokoban_learning.py run --updates 48 --set actor.lr=5e-4
    python benchmarks/sokoban_learning.py show                  # the result file, as a table

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
from verlog.envs.sokoban import ACTIONS  # noqa: E402

CONFIG = ROOT / "configs" / "sokoban_words.yaml"
OUT = ROOT / "runs" / "sokoban_learning"
RESULTS = ROOT / "benchmarks" / "results" / "sokoban_learning"
#: the fewest held-out rooms a comparison is made on (the issue's floor)
MIN_EVAL_EPISODES = 64


def _line(total: int) -> Any:
    def line_of(r: dict[str, Any]) -> str:
        if r["kind"] != "update":
            return f"  {r['kind']} at update {r['update']} ({r['elapsed_s']:.0f} s)"
        return (
            f"  update {r['update']}/{total}: {num(r.get('episodes')):.0f} episodes ended, "
            f"success {num(r.get('win_rate')):.2f}, return {num(r.get('episode_return')):.2f}, "
            f"length {num(r.get('episode_length')):.1f}, invalid {num(r.get('invalid_action_rate')):.2f}, "
            f"v_loss {num(r.get('value_loss')):.3f}, {r['rollout_s']:.0f}+{r['update_s']:.0f} s"
        )

    return line_of


def run(updates: int | None, out: Path, results: Path, extra: list[str], allow_few: bool = False) -> dict[str, Any]:
    """Train (or resume) the recipe with the before/after evaluations; random valid moves on the
    same held-out rooms; write and print the result. ``allow_few``: accept fewer than
    :data:`MIN_EVAL_EPISODES` held-out rooms (plumbing checks only)."""
    run_dir = out / "run"
    overrides = [*([f"trainer.total_updates={updates}"] if updates else []), *extra]
    # the comparison needs both evaluations, whatever the overrides say
    config = load_config(
        CONFIG,
        [f"trainer.run_dir={run_dir}", "wandb.mode=disabled", *overrides, "eval.at_start=true", "eval.at_end=true"],
    )
    episodes = config.eval.episode_count()
    if episodes < MIN_EVAL_EPISODES and not allow_few:
        raise SystemExit(
            f"error: eval.episodes={episodes} is too few for the comparison; "
            f"allowed: at least {MIN_EVAL_EPISODES} held-out rooms"
        )
    total = config.trainer.total_updates
    batch_turns = config.trainer.num_envs * config.trainer.turns_per_env
    resume = (run_dir / "metrics.jsonl").is_file()
    print(
        f"sokoban-words on Sokoban: {total} updates x {batch_turns} turns, {episodes} held-out rooms from seed "
        f"{config.eval.seed}{' (resuming)' if resume else ''}",
        flush=True,
    )
    records, compared = train_and_compare(config, _line(total))
    compared["oracle_move"] = oracle_moves(config, run_dir)
    updates_done = [r for r in records if r["kind"] == "update"]
    summary = {
        "overrides": overrides,
        "updates": total,
        "batch_turns": batch_turns,
        "eval_seed": config.eval.seed,
        **compared,
        "seconds_per_update": sum(r["rollout_s"] + r["update_s"] for r in updates_done) / max(1, len(updates_done)),
        "curve": [
            {
                "update": r["update"],
                "win_rate": num(r.get("win_rate")),
                "return": num(r.get("episode_return")),
                "length": num(r.get("episode_length")),
                "invalid": num(r.get("invalid_action_rate")),
            }
            for r in updates_done
        ],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "result.json").write_text(json.dumps(summary, indent=1))
    print(show(summary), end="")
    return summary


class MovePolicy:
    """``sokoban-words`` scoring the four moves after a room's prompt (its logits at the answer),
    the prompt built as ``graphs/sokoban.py`` builds it: the current room under ``instruction``."""

    def __init__(self, instruction: str):
        from verlog.llm.prompt import PromptRenderer
        from verlog.models import load_causal_lm, load_tokenizer, resolve_model_path

        path = resolve_model_path("sokoban-words")
        self.tokenizer = load_tokenizer(path)
        self.model = load_causal_lm(path)
        self.renderer = PromptRenderer(self.tokenizer)
        self.instruction = instruction
        self.moves = [self.tokenizer.convert_tokens_to_ids(a) for a in ACTIONS]

    def prompt(self, observation: str) -> list[int]:
        from verlog.envs.agent_graph import build_prompt

        return self.renderer.render(build_prompt(self.instruction, [], observation, 0))

    def logits(self, prompts: list[list[int]]) -> Any:
        """The moves' logits after each prompt (left-padded; positions as the engine counts them)."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, self.moves]


def oracle_move_probability(policy: MovePolicy, seeds: range, **env_settings: Any) -> dict[str, float]:
    """The policy's mean probability of the oracle's move over the states of each room's shortest
    solution, by how far the state is from solved (``"1"`` .. ``"4"``, ``"5+"`` moves): where a
    policy learns first (one move from a win, the reward comes at once) and how far back it reaches.
    A uniform policy over the four moves scores 0.25 everywhere."""
    import torch

    from verlog.envs.sokoban import SokobanEnv
    from verlog.envs.sokoban.solver import solve

    prompts, moves, bucket = [], [], []
    for seed in seeds:
        env = SokobanEnv(**env_settings)
        observation = env.reset(seed)
        plan = solve(env.room, env.state) or []
        for k, move in enumerate(plan):
            prompts.append(policy.prompt(observation))
            moves.append(ACTIONS.index(move))
            bucket.append(str(len(plan) - k) if len(plan) - k < 5 else "5+")
            observation = env.step(move).observation
    with torch.no_grad():
        chosen = torch.softmax(policy.logits(prompts), -1)[torch.arange(len(moves)), torch.tensor(moves)]
    return {
        key: float(chosen[[i for i, b in enumerate(bucket) if b == key]].mean())
        for key in ("1", "2", "3", "4", "5+")
        if key in bucket
    }


def oracle_moves(config: Any, run_dir: Path) -> dict[str, dict[str, float]]:
    """The untrained and the trained policy's probability of the oracle's move on the held-out
    rooms' solution states, by moves to solved (:func:`oracle_move_probability`)."""
    import torch

    from verlog.models import load_causal_lm
    from verlog.weights.checkpoint import ACTOR_FOLDER, latest_checkpoint

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = MovePolicy(str(config.multi_turn.langgraph.graph_kwargs.get("instruction", "")))
        rooms = range(config.eval.seed, config.eval.seed + config.eval.episode_count())
        before = oracle_move_probability(policy, rooms)
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            return {"before": before}
        policy.model = load_causal_lm(checkpoint / ACTOR_FOLDER).eval()
        return {"before": before, "after": oracle_move_probability(policy, rooms)}
    finally:
        torch.set_num_threads(torch_threads)


def show(s: dict[str, Any]) -> str:
    """The result as a markdown table: random valid moves, before and after training."""

    def cell(d: dict[str, float]) -> str:
        return f"{d['win_rate']:.3f} ± {d['win_rate_se']:.3f} | {d['return']:.2f} ± {d['return_se']:.2f} | {d['length']:.1f}"

    n = s["after"]["episodes"]
    oracle = s.get("oracle_move", {})
    moves = [
        f"P(oracle's move), {name} ({n} rooms' solution states, by moves to solved; 0.25 uniform): "
        + ", ".join(f"{k}: {v:.3f}" for k, v in oracle[name].items())
        for name in ("before", "after")
        if name in oracle
    ]
    lines = [
        f"| player ({n} held-out rooms, seeds {s['eval_seed']}+) | success rate (rooms solved) | return | moves per game |",
        "|---|---|---|---|",
        *comparison_rows(s, "random valid moves", cell),
        f"training {s['training_wall_s'] / 60:.1f} min (critic pre-training included, {s['seconds_per_update']:.1f} s "
        f"per update of {s['batch_turns']} turns), evaluations {s['eval_s'] / 60:.1f} min, random baseline "
        f"{s['random_s'] / 60:.1f} min; load {s['load']['mean']:.1f} (max {s['load']['max']:.1f}); commit {s['commit']}",
        *moves,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return comparison_main(
        argv,
        description=__doc__.splitlines()[0],
        script="benchmarks/sokoban_learning.py",
        out=OUT,
        results=RESULTS,
        run=lambda a: run(a.updates, a.out, a.results, a.set, a.allow_few),
        show=show,
        more_run_args=lambda p: p.add_argument(
            "--allow-few",
            action="store_true",
            help=f"accept fewer than {MIN_EVAL_EPISODES} held-out rooms (plumbing checks only)",
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
