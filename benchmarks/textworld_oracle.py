"""The TextWorld oracle under BALROG's protocol on fresh games: wins/N per game type.

For each of BALROG's TextWorld game types (treasure hunter, the cooking game, coin collector), it
generates games with BALROG's settings (``protocol="balrog"``; see ``verlog/envs/textworld/env.py``)
for seeds that are not in BALROG's 25-game pool (default: 100,000 and up), one game per seed
(``pool_size=None``), and plays each with the game's own walkthrough through the text interface
(``TextWorldWalkthroughAgent``: every command goes through BALROG's answer cleaning, 80-command
cap). It prints, per game type, the wins out of the games played, the generation time of the
games it had to build (mean, median, max), how many candidate seeds TextWorld rejected, and the
failures with their reason (lost, cut at the cap, a game that could not be built ...).

Each game's record is appended to ``--out`` (JSON lines) as soon as it is played, so an
interrupted run goes on where it stopped when started again with the same ``--out``.

    python benchmarks/textworld_oracle.py                                  # 200 games per type
    python benchmarks/textworld_oracle.py --families coin_collector --games 20
    python benchmarks/textworld_oracle.py --families treasure_hunter --time-limit 3600
    python benchmarks/textworld_oracle.py --summary                         # only print the table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verlog.envs.base import play_steps  # noqa: E402
from verlog.envs.textworld import BALROG_TASK_NAMES  # noqa: E402
from verlog.envs.textworld.env import (  # noqa: E402
    TextWorldTextEnv,
    TextWorldWalkthroughAgent,
    shortened_walkthrough,
)
from verlog.envs.textworld.games import build_game, cached_game  # noqa: E402

DEFAULT_OUT = Path("runs/bench/textworld_oracle.jsonl")


def play_one(family: str, seed: int, cache_dir: Path | None) -> dict[str, Any]:
    """Generate (unless cached) and play one game; its record."""
    env = TextWorldTextEnv(family, protocol="balrog", pool_size=None, cache_dir=cache_dir)
    was_cached = cached_game(family, env.settings, seed, cache_dir) is not None
    t0 = time.perf_counter()
    path, used = build_game(family, env.settings, seed, cache_dir)
    generation_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = play_steps(env, TextWorldWalkthroughAgent(env), seed)
    play_s = time.perf_counter() - t0
    last = results[-1]
    won = bool(last.info.get("won"))
    record: dict[str, Any] = {
        "family": family,
        "seed": seed,
        "game_seed": used,
        "rejected_candidates": (used - seed) // 1_000_003,
        "generated": not was_cached,
        "generation_s": round(generation_s, 2),
        "play_s": round(play_s, 3),
        "won": won,
        "score": last.info.get("score"),
        "max_score": last.info.get("max_score"),
        "progression": last.info.get("progression"),
        "steps": len(results),
        "walkthrough_length": len(env.walkthrough),
        "plan_length": len(shortened_walkthrough(env.walkthrough)),
    }
    if not won:
        record["reason"] = "lost" if last.info.get("lost") else ("cap" if last.truncated else "ended")
        record["actions"] = [r.info.get("action") for r in results]
        record["walkthrough"] = env.walkthrough
        record["last_observation"] = last.observation[-600:]
    env.close()
    return record


def load(out: Path) -> list[dict[str, Any]]:
    if not out.is_file():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def summary(records: list[dict[str, Any]], families: list[str]) -> str:
    lines = [
        f"{'game type':<18} {'wins/N':>9} {'win %':>6} {'gen s mean':>10} {'median':>7} {'max':>7} "
        f"{'rejected':>8} {'steps mean/max':>14}"
    ]
    for family in families:
        rows = [r for r in records if r["family"] == family]
        if not rows:
            continue
        wins = sum(r["won"] for r in rows)
        played = [r for r in rows if "error" not in r]
        generated = [r["generation_s"] for r in played if r["generated"]]
        gen = (
            f"{statistics.fmean(generated):>10.1f} {statistics.median(generated):>7.1f} {max(generated):>7.1f}"
            if generated
            else f"{'cached':>10} {'':>7} {'':>7}"
        )
        steps = [r["steps"] for r in rows if r["won"]] or [0]
        lines.append(
            f"{BALROG_TASK_NAMES[family]:<18} {wins:>4}/{len(rows):<4} {100 * wins / len(rows):>6.1f} {gen} "
            f"{sum(r['rejected_candidates'] for r in played):>8} {statistics.fmean(steps):>9.1f}/{max(steps):<4}"
        )
        for r in rows:
            if "error" in r:
                lines.append(f"    seed {r['seed']}: error: {r['error'].splitlines()[-1]}")
            elif not r["won"]:
                lines.append(
                    f"    seed {r['seed']} (game seed {r['game_seed']}): {r['reason']} after {r['steps']} "
                    f"commands, score {r['score']}/{r['max_score']}, walkthrough {r['walkthrough_length']}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--families",
        nargs="*",
        default=["coin_collector", "cooking", "treasure_hunter"],
        choices=list(BALROG_TASK_NAMES),
    )
    parser.add_argument("--games", type=int, default=200, help="games per game type")
    parser.add_argument("--first-seed", type=int, default=100_000, help="seeds first-seed .. first-seed+games-1")
    parser.add_argument("--cache-dir", type=Path, default=None, help="game cache (default: verlog's)")
    parser.add_argument(
        "--time-limit", type=float, default=None, help="seconds per game type after which no new game is started"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines, one per game (resumed)")
    parser.add_argument("--summary", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    records = load(args.out)
    if args.summary:
        print(summary(records, args.families))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for family in args.families:
        done = {r["seed"] for r in records if r["family"] == family}
        start = time.perf_counter()
        for seed in range(args.first_seed, args.first_seed + args.games):
            if seed in done:
                continue
            if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
                print(f"{family}: time limit reached", flush=True)
                break
            try:
                record = play_one(family, seed, args.cache_dir)
            except Exception as exc:  # noqa: BLE001 - a game TextWorld cannot build is a row, not the end
                record = {
                    "family": family,
                    "seed": seed,
                    "won": False,
                    "reason": "error",
                    "error": f"{type(exc).__name__}: {exc}"[-2000:],
                }
            records.append(record)
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")
            if "error" in record:
                print(f"{family} seed {seed}: ERROR {record['error'].splitlines()[0]}", flush=True)
            else:
                print(
                    f"{family} seed {seed}: {'won' if record['won'] else 'NOT WON'} in {record['steps']} "
                    f"(generation {record['generation_s']:.1f} s)",
                    flush=True,
                )
    print(summary(records, args.families))


if __name__ == "__main__":
    main()
