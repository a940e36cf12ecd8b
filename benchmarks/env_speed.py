"""How fast the text games run: steps per second and reset time for each environment.

Plays random valid actions through ``env.step("ACTION: <name>")`` (parsing and text rendering
included, as in training) and times ``reset`` separately; the first reset of each game is
reported on its own because it pays one-off costs (Crafter's world generator compiles with
numba). BabaIsAI tasks are included when ``verlog.envs.babaisai`` is present.

    python benchmarks/env_speed.py            # every environment, 3000 steps each
    python benchmarks/env_speed.py --quick    # fewer steps, Verlog's BabaIsAI tasks only
    python benchmarks/env_speed.py --envs babyai:goto crafter --steps 10000
    python benchmarks/env_speed.py --envs minihack:Quest-Easy nethack --protocol balrog
    python benchmarks/env_speed.py --envs textworld:coin_collector --concurrent-resets 16

Under ``--protocol balrog`` answers are bare action names (BALROG's naive agent).
``--concurrent-resets N`` instead starts N games at once from N threads (as the agent graph's
worker threads do) and counts the resets that fail.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verlog.envs import PROTOCOLS  # noqa: E402
from verlog.envs.registry import list_envs, make_env  # noqa: E402


@dataclass
class Speed:
    """One environment's timings."""

    name: str
    first_reset_s: float
    reset_ms: float
    steps_per_s: float
    steps: int
    episodes: int


def measure(name: str, steps: int, resets: int, seed: int = 0, protocol: str = "verlog") -> Speed:
    """Time ``resets`` seeded resets, then ``steps`` random valid steps (resetting when done)."""
    env = make_env(name, seed=seed, protocol=protocol)
    prefix = "" if protocol == "balrog" else "ACTION: "
    started = time.perf_counter()
    env.reset(seed)
    first = time.perf_counter() - started

    started = time.perf_counter()
    for i in range(resets):
        env.reset(seed + 1 + i)
    reset_ms = 1000 * (time.perf_counter() - started) / max(resets, 1)

    rng = random.Random(seed)
    env.reset(seed)
    episodes, stepping = 1, 0.0
    for _ in range(steps):
        answer = prefix + rng.choice(env.valid_actions())
        t0 = time.perf_counter()
        result = env.step(answer)
        stepping += time.perf_counter() - t0
        if result.done:
            env.reset()
            episodes += 1
    env.close()
    return Speed(name, first, reset_ms, steps / stepping, steps, episodes)


def concurrent_resets(name: str, count: int, seed: int = 0, protocol: str = "verlog") -> tuple[int, float]:
    """Reset ``count`` games of ``name`` at once from ``count`` threads (seeds ``seed`` ...,
    four distinct games), each then taking three steps: (failures, seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> bool:
        try:
            env = make_env(name, protocol=protocol)
            env.reset(seed + i % 4)
            for _ in range(3):
                env.step(env.valid_actions()[0] if env.valid_actions() else "look")
            env.close()
            return True
        except Exception as exc:  # noqa: BLE001 - counted and shown
            print(f"  reset {i}: {type(exc).__name__}: {exc}"[:200], flush=True)
            return False

    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        ok = list(pool.map(one, range(count)))
    return ok.count(False), time.perf_counter() - started


def default_envs(quick: bool) -> list[str]:
    """Every registered name but BALROG's other games; with ``quick``, only Verlog's four
    BabaIsAI tasks."""
    # TextWorld, MiniHack and NetHack have their own benchmark (benchmarks/balrog_envs.py): a
    # TextWorld reset with a new seed generates and compiles a game (seconds)
    names = [n for n in list_envs() if not n.startswith(("textworld:", "minihack:", "nethack"))]
    if not quick:
        return names
    try:
        from verlog.envs.babaisai import VERLOG_TASKS  # type: ignore[attr-defined]
    except ImportError:
        return names
    keep = {f"babaisai:{task}" for task in VERLOG_TASKS}
    return [n for n in names if not n.startswith("babaisai:") or n in keep]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 steps and 5 resets per env")
    parser.add_argument("--envs", nargs="*", help="environment names (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="random steps per env")
    parser.add_argument("--resets", type=int, default=None, help="timed resets per env")
    parser.add_argument("--protocol", default=PROTOCOLS[0], choices=PROTOCOLS)
    parser.add_argument(
        "--concurrent-resets",
        type=int,
        default=0,
        metavar="N",
        help="start N games at once from N threads and count failures",
    )
    args = parser.parse_args(argv)
    steps = args.steps or (300 if args.quick else 3000)
    resets = args.resets or (5 if args.quick else 30)
    names = args.envs or default_envs(args.quick)
    if args.concurrent_resets:
        for name in names:
            failures, seconds = concurrent_resets(name, args.concurrent_resets, protocol=args.protocol)
            print(f"{name}: {args.concurrent_resets} concurrent resets, {failures} failed, {seconds:.1f} s", flush=True)
        return

    width = max([len(n) for n in names] + [11])
    columns = f"{'steps/s':>9} {'reset ms':>9} {'1st reset s':>11} {'episodes':>8}"
    header = f"{'environment':<{width}} {columns}"
    print(header)
    print("-" * len(header))
    for name in names:
        s = measure(name, steps, resets, protocol=args.protocol)
        print(
            f"{s.name:<{width}} {s.steps_per_s:>9.0f} {s.reset_ms:>9.2f} {s.first_reset_s:>11.3f} {s.episodes:>8}",
            flush=True,
        )


if __name__ == "__main__":
    main()
