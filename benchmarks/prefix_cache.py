"""P8: the embedded engine's prefix cache across calls (target: >= 3x rollout turns/s, <= 25 %
of prompt tokens computed).

Plays BabyAI "go to" episodes through ``graphs/babyai.py`` with SmolLM2-135M-Instruct on the
embedded engine, once with the prefix cache on and once off (the same model object, two
engines), in rounds that alternate which goes first so load on a shared machine hits both alike.
Decoding is greedy, so both engines play exactly the same turns (the cache does not change
outputs). Every turn's prompt starts with the game's instruction (about 340 SmolLM2 tokens,
with the episode's mission in it); with the cache, only the first turn of an episode computes it.

Prints turns/s with and without the cache and their ratio, prompt tokens computed / prompt tokens
for each engine (without the cache, only prompts that arrive together share their common start),
and where each engine's time went (prefill vs decode), since decoding is not what a prefix cache
speeds up. The default run (2 rounds of 4 episodes of up to 6 turns at a time, 32-token answers,
as in the quick start's graph settings) takes under 10 minutes on 2 shared CPU cores.

    python benchmarks/prefix_cache.py [--episodes 4] [--max-steps 6] [--history-turns 0]
        [--max-tokens 32] [--rounds 2] [--device cpu]

Measured 2026-11-23 on 2 CPU cores shared with other work (load average 11-13, so ratios only):
default run 4.66x (0.586 vs 0.126 turns/s), 16.2 % of prompt tokens computed with the cache vs
88.5 % without (about 8.5 minutes in all); with ``--history-turns 1`` 3.17x and 16.8 %. Without
the cache, prefill is 87-88 % of the engine's time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.backends.embedded import EmbeddedEngine, EngineStats  # noqa: E402
from verlog.envs.agent_graph import recursion_limit_for  # noqa: E402
from verlog.graph_file import load_graph_file  # noqa: E402
from verlog.llm import VerlogChatModel  # noqa: E402
from verlog.models import load_causal_lm, load_tokenizer  # noqa: E402
from verlog.rollout import run_episodes  # noqa: E402


async def play(engine: EmbeddedEngine, tokenizer, args: argparse.Namespace, seeds: list[int]) -> tuple[int, float]:
    """Run one episode per seed, all at once; return (turns played, seconds)."""
    graph_file = load_graph_file(ROOT / "graphs" / "babyai.py")
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, temperature=0.0, max_tokens=args.max_tokens)
    graph = graph_file.build(model, task="goto", history_turns=args.history_turns, max_steps=args.max_steps)
    t0 = time.perf_counter()
    episodes = await run_episodes(
        graph,
        [graph_file.episode_input(s) for s in seeds],
        concurrency=len(seeds),
        graph_config={"recursion_limit": recursion_limit_for(args.max_steps)},
    )
    elapsed = time.perf_counter() - t0
    failed = [e for e in episodes if e.failed]
    if failed:
        raise SystemExit(f"{len(failed)} episodes failed, e.g.: {failed[0].error}")
    return sum(len(e.turns) for e in episodes), elapsed


def describe(name: str, turns: int, seconds: float, stats: EngineStats) -> str:
    return (
        f"  cache {name:3s}: {turns / seconds:6.3f} turns/s ({turns} turns in {seconds:6.1f} s); "
        f"prompt tokens computed {stats.computed_prompt_tokens:,} / {stats.prompt_tokens:,} "
        f"= {100 * stats.computed_fraction:4.1f} %; engine time: prefill {stats.prefill_s:6.1f} s, "
        f"decode {stats.decode_s:6.1f} s"
    )


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer("smollm2")
    lm = load_causal_lm("smollm2", device=args.device)
    engines = {
        "on": EmbeddedEngine(lm, tokenizer, max_batch_size=args.episodes),
        "off": EmbeddedEngine(lm, tokenizer, max_batch_size=args.episodes, prefix_cache_bytes=0),
    }
    for engine in engines.values():  # warm-up: one short episode each, not counted
        warm = argparse.Namespace(**{**vars(args), "max_steps": 1})
        await play(engine, tokenizer, warm, [10_000])
        engine.stats = EngineStats()
        engine.prefix_cache.clear()
    turns = {name: 0 for name in engines}
    seconds = {name: 0.0 for name in engines}
    for r in range(args.rounds):
        seeds = list(range(r * args.episodes, (r + 1) * args.episodes))
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for name in order:
            n, s = await play(engines[name], tokenizer, args, seeds)
            turns[name] += n
            seconds[name] += s
            print(f"round {r + 1}/{args.rounds}, cache {name}: {n} turns in {s:.1f} s", flush=True)
    print(
        f"\nSmolLM2-135M on {args.device}, BabyAI goto: {args.rounds} rounds of {args.episodes} concurrent "
        f"episodes, at most {args.max_steps} turns each, history of {args.history_turns} exchange(s), "
        f"greedy answers of at most {args.max_tokens} tokens"
    )
    for name in ("off", "on"):
        print(describe(name, turns[name], seconds[name], engines[name].stats))
    assert turns["on"] == turns["off"], "greedy decoding should play the same turns with and without the cache"
    ratio = (turns["on"] / seconds["on"]) / (turns["off"] / seconds["off"])
    fraction = engines["on"].stats.computed_fraction
    print(f"speed-up with the prefix cache: {ratio:.2f}x (target >= 3x) {'OK' if ratio >= 3 else 'MISSED'}")
    print(
        f"prompt tokens computed with it: {100 * fraction:.1f} % (target <= 25 %) "
        f"{'OK' if fraction <= 0.25 else 'MISSED'}"
    )
    off = engines["off"].stats
    print(
        f"without the cache, prefill is {100 * off.prefill_s / max(off.busy_s, 1e-9):.0f} % of the engine's time; "
        f"decoding alone bounds the speed-up at {off.busy_s / max(off.decode_s, 1e-9):.1f}x"
    )
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="episodes played at once (each round)")
    parser.add_argument("--max-steps", type=int, default=6, help="turn cap of an episode")
    parser.add_argument("--history-turns", type=int, default=0, help="past exchanges in each prompt")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    asyncio.run(main(parser.parse_args()))
