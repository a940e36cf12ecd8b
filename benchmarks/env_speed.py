"""How fast the text games run: steps per second and reset time for each environment.

Plays random valid actions through ``env.step("ACTION: <name>")`` (parsing and text rendering
included, as in training) and times ``reset`` separately; the first reset of each game is
reported on its own because it pays one-off costs (Crafter's world generator compiles with
numba). BabaIsAI tasks are included when ``verlog.envs.babaisai`` is present.

    python benchmarks/env_speed.py            # every environment, 3000 steps each
    python benchmarks/env_speed.py --quick    # fewer steps, Verlog's BabaIsAI tasks only
    python benchmarks/env_speed.py --envs babyai:goto crafter --steps 10000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def measure(name: str, steps: int, resets: int, seed: int = 0) -> Speed:
    """Time ``resets`` seeded resets, then ``steps`` random valid steps (resetting when done)."""
    env = make_env(name, seed=seed)
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
        answer = f"ACTION: {rng.choice(env.valid_actions())}"
        t0 = time.perf_counter()
        result = env.step(answer)
        stepping += time.perf_counter() - t0
        if result.done:
            env.reset()
            episodes += 1
    env.close()
    return Speed(name, first, reset_ms, steps / stepping, steps, episodes)


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
    args = parser.parse_args(argv)
    steps = args.steps or (300 if args.quick else 3000)
    resets = args.resets or (5 if args.quick else 30)
    names = args.envs or default_envs(args.quick)

    width = max([len(n) for n in names] + [11])
    columns = f"{'steps/s':>9} {'reset ms':>9} {'1st reset s':>11} {'episodes':>8}"
    header = f"{'environment':<{width}} {columns}"
    print(header)
    print("-" * len(header))
    for name in names:
        s = measure(name, steps, resets)
        print(
            f"{s.name:<{width}} {s.steps_per_s:>9.0f} {s.reset_ms:>9.2f} "
            f"{s.first_reset_s:>11.3f} {s.episodes:>8}",
            flush=True,
        )


if __name__ == "__main__":
    main()
