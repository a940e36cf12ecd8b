"""How many held-out levels were training levels? Split by seed alone, and split by content too.

Counts, for Sokoban (verl-agent's rooms) and BabyAI (BALROG's levels), how many of the held-out
levels an evaluation plays have the same start state (the whole level, the player's start included)
or the same puzzle (the level without the player's start) as a level training plays, once with the
levels split by seed alone (``held_out_share: 0``) and once as the games split them now
(``verlog.envs.held_out``: the held-out seeds draw only the held-out share of the contents).

    python benchmarks/held_out_overlap.py                       # both games, 128 and 512 held-out levels
    python benchmarks/held_out_overlap.py --training 20000      # more training levels
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.envs import make_env  # noqa: E402
from verlog.envs.held_out import HELD_OUT_SHARE  # noqa: E402


def sokoban_levels(share: float, seeds: range, **settings: Any) -> list[tuple[str, str]]:
    """``(start state, puzzle)`` of each seed's room."""
    from verlog.envs.sokoban.env import level_content

    env = make_env("sokoban", held_out_share=share, **settings)
    out = []
    for seed in seeds:
        env.reset(seed)
        out.append((f"{level_content(env.level)} player {env.state.player}", level_content(env.level)))
    return out


def babyai_levels(share: float, seeds: range, task: str = "goto") -> list[tuple[str, str]]:
    env = make_env(f"babyai:{task}", protocol="balrog", held_out_share=share)
    out = []
    for seed in seeds:
        env.reset(seed)
        level = env.level
        out.append((f"{env.level_content()} agent {tuple(level.agent_pos)} {level.agent_dir}", env.level_content()))
    return out


def overlap(training: list[tuple[str, str]], held: list[tuple[str, str]]) -> dict[str, int]:
    starts, puzzles = {s for s, _ in training}, {p for _, p in training}
    return {
        "held_out": len(held),
        "same_start_state": sum(s in starts for s, _ in held),
        "same_puzzle": sum(p in puzzles for _, p in held),
    }


def game_overlap(
    levels: Callable[..., list[tuple[str, str]]], training: range, held: range, train_kw: dict, held_kw: dict
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, share in (("seed_only", 0.0), ("by_content", HELD_OUT_SHARE)):
        trained = levels(share, training, **train_kw)
        for n in (128, len(held)):
            out[f"{label}/{n}"] = overlap(trained, levels(share, range(held.start, held.start + n), **held_kw))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--training", type=int, default=13_000, help="training levels (seeds 0 ...)")
    parser.add_argument("--held-out", type=int, default=512, help="held-out levels")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts here")
    args = parser.parse_args(argv)
    from verlog.envs.babyai.env import HELD_OUT_SEED_START as BABYAI_HELD_OUT
    from verlog.envs.sokoban import HELD_OUT_SEED_START as SOKOBAN_HELD_OUT

    training = range(args.training)
    result = {
        # the Sokoban recipe trains on rooms of depth 1-12 and evaluates verl-agent's (depth 30)
        "sokoban": game_overlap(
            sokoban_levels,
            training,
            range(SOKOBAN_HELD_OUT, SOKOBAN_HELD_OUT + args.held_out),
            {"search_depth": [1, 12]},
            {"search_depth": 30},
        ),
        "babyai_goto": game_overlap(
            babyai_levels, training, range(BABYAI_HELD_OUT, BABYAI_HELD_OUT + args.held_out), {}, {}
        ),
    }
    for game, counts in result.items():
        for key, c in counts.items():
            split, n = key.split("/")
            print(
                f"{game:12} {split:10} of {n:>4} held-out levels: {c['same_start_state']:>4} with a training level's "
                f"start state, {c['same_puzzle']:>4} with a training level's puzzle ({args.training} training levels)"
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
