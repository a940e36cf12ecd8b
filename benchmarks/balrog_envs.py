"""BALROG's other games (TextWorld, MiniHack, NetHack): steps per second and prompt tokens per turn.

For each environment:

* ``steps/s``: random valid actions through ``env.step("ACTION: <name>")`` (parsing, the game,
  prompt handling and text rendering included, as in training), resets excluded;
* ``reset ms``: a reset of an already generated (cached) game; ``1st reset s`` the very first
  one in the process (TextWorld generates and compiles the game then, unless it is cached);
* ``prompt tokens/turn``: the prompt the agent graph sends each turn (the game's instruction as
  system message, one previous exchange, ``Current Observation:``; built with
  ``verlog.envs.agent_graph.build_prompt(..., history_turns=1)`` and the tiny model's chat
  template and byte-level BPE), mean and max over one episode played by the environment's bot
  (TextWorld: the walkthrough; MiniHack: the search agent) or by random actions (NetHack).

    python benchmarks/balrog_envs.py              # every new environment
    python benchmarks/balrog_envs.py --quick      # fewer steps
    python benchmarks/balrog_envs.py --envs nethack minihack:Corridor-R3 --steps 5000
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verlog.envs.agent_graph import build_prompt  # noqa: E402
from verlog.envs.registry import list_envs, make_env  # noqa: E402

FAMILIES = ("textworld:", "minihack:", "nethack")


def default_envs() -> list[str]:
    return [n for n in list_envs() if n.startswith(FAMILIES)]


def steps_per_second(name: str, steps: int, seed: int = 0) -> tuple[float, float, float]:
    """(first reset s, reset ms, random steps/s)."""
    env = make_env(name, seed=seed)
    t0 = time.perf_counter()
    env.reset(seed)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.reset(seed)
    reset_ms = 1000 * (time.perf_counter() - t0)
    rng = random.Random(seed)
    stepping, done_steps = 0.0, 0
    while done_steps < steps:
        answer = f"ACTION: {rng.choice(env.valid_actions())}"
        t0 = time.perf_counter()
        result = env.step(answer)
        stepping += time.perf_counter() - t0
        done_steps += 1
        if result.done:
            env.reset(seed)  # replays a cached game (TextWorld) instead of generating new ones
    env.close()
    return first, reset_ms, steps / stepping


def _bot(name: str, env):
    from verlog.envs.nle.agents import RandomTextAgent
    from verlog.envs.play import make_bot

    bot = make_bot(env, name)
    return bot if bot is not None else RandomTextAgent(env.valid_actions, seed=0)


def prompt_tokens(name: str, renderer, turns: int, seed: int = 0) -> tuple[float, int, int]:
    """(mean, max prompt tokens per turn, turns played) over one bot episode."""
    env = make_env(name, seed=seed)
    observation = env.reset(seed)
    bot = _bot(name, env)
    bot.reset()
    history: list[tuple[str, str]] = []
    sizes = []
    for _ in range(turns):
        messages = build_prompt(env.instruction, history, observation, history_turns=1)
        sizes.append(len(renderer.render(messages)))
        answer = f"I look at what I see and choose.\n{bot.act(observation)}"
        result = env.step(answer)
        history.append((observation, answer))
        observation = result.observation
        if result.done:
            break
    env.close()
    return statistics.fmean(sizes), max(sizes), len(sizes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 steps, 50-turn episodes")
    parser.add_argument("--envs", nargs="*", help="environment names (default: every new one)")
    parser.add_argument("--steps", type=int, default=None, help="random steps per env for steps/s")
    parser.add_argument("--turns", type=int, default=None, help="most turns of the prompt-token episode")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    steps = args.steps or (300 if args.quick else 2000)
    turns = args.turns or (50 if args.quick else 200)
    names = args.envs or default_envs()

    from verlog.llm.prompt import PromptRenderer
    from verlog.models import load_tokenizer

    renderer = PromptRenderer(load_tokenizer("tiny"))
    width = max(len(n) for n in names + ["environment"])
    header = (
        f"{'environment':<{width}} {'steps/s':>8} {'reset ms':>9} {'1st reset s':>11} "
        f"{'prompt tok/turn':>15} {'max':>6} {'turns':>6}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        first, reset_ms, rate = steps_per_second(name, steps)
        mean, most, played = prompt_tokens(name, renderer, turns)
        print(
            f"{name:<{width}} {rate:>8.0f} {reset_ms:>9.1f} {first:>11.2f} {mean:>15.0f} {most:>6} {played:>6}",
            flush=True,
        )


if __name__ == "__main__":
    main()
