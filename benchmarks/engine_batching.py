"""P2: the embedded engine's request batching (target: >= 8x the turns/s of one episode at a time).

Runs the same total number of turns of a two-node policy <-> environment loop on the tiny
random-init model, once with 32 episodes running concurrently (their calls batched together by
the engine) and once one episode at a time. Prints turns/s for both and the ratio (goal >= 8x).
Usage: python benchmarks/engine_batching.py [--episodes 32] [--turns 8] [--max-tokens 16]

It also times the engine alone (no graph, no game) decoding with 1 row and with every row busy
(a decode step's cost grows with its rows, which bounds what batching can gain on decoding), and
the same episodes against an engine that answers at once (what the event loop alone can drive).

The batched run also prints the cores the process kept busy (its CPU time, every thread's, over
the wall time): near 1 on two free cores means the engine's thread and the graphs' event loop
mostly take turns (each holds the GIL for its Python work) instead of running at once.

Each measurement is repeated side by side (``--repeats``, default 3) and the median reported, with
the share of the decode ceiling it reaches (target >= 85%), for the engine on a thread of this
process and in a process of its own (``--engine``, default both).

Before the decode step moved to the device (2026-11-24, nothing else running): 5.9-6.5x, 27-28
requests per pass, ceiling 7.1-8.2x; per-row Python work and a host copy of every row's
distribution each step. 2026-11-26, with the decode step on the device
(``verlog.backends.decode_rows``: sampling, stops and grammar masks as batched tensor ops, one
``[B]`` read-back per step), in the quietest windows this shared machine gave (another engineer's
training benchmark held about a core): load 1.4-1.8, 8.7x, 7.8x, 7.2x (median 7.8x, 85% of the
ceiling; 23-25 requests per pass). Prompts whose cache covers all but their last token then
joined without a prefill pass (26-28 requests per pass): load 0.8-1.8, 7.6x, 8.9x, 11.4x (median
8.9x; 166-180 turns/s against 15-22; 79-99% of the ceiling, median 87%); load 1.2-1.4 with a
pip resolve running beside it, 7.3x, 7.2x, 7.1x (median 7.2x, 77%). The ratio needs two free
cores (the engine's thread and the event loop run at once in the batched run, one at a time in
the single one), so a third busy process lowers it; on a GPU a decode step's cost hardly grows
with its rows.
2026-11-26 13:20, the quietest window of the day (load 0.2-0.8, nothing else running), after
the step-info and registry work: 7.7x, 7.0x, 8.3x and 7.7x, 7.8x, 9.0x (medians 7.7x and 7.8x;
150-158 and 125-155 turns/s against 16-23), 54-88% of ceilings of 9.4-14.3x: the one-row decode
step measured 2.2-3.7 ms against 6.2-8.0 ms with 32 rows, so the ceiling itself moves by half
between runs. Below the 8x / 85% target on these runs.
2026-12-06 (issue 51 item 3), after rows kept in the prefix cache copy only their missing tokens
and the KV layer keeps its view (load 1.7-2.9, another engineer's benchmarks running): 8.0x and 8.3x
(medians; 61% and 67% of the ceiling; runs 60-70%) against 7.0x and 7.7x (58%, 64%; runs 45-72%)
before, side by side: within the noise. The profile explains the ceiling's gap: the batched run
keeps 0.97-1.01 cores busy, and per turn the engine's thread spends 4.2-5.3 ms of CPU and the event
loop 1.8-2.9 ms, which add up to the wall time (6.6-8.0 ms): the two never run at once. The tiny model's forward pass is mostly Python (HF's modules: about 70% of the
samples where the engine's thread holds the GIL), so while the graphs run Python the engine waits
for the GIL, and the other way round. Serialized, decoding (about 3.5 ms a turn at 24 rows) plus
the loop (about 2 ms) plus prefills bound the run at about 60% of the ceiling; 85% needs the graphs
and the engine in separate processes (or a forward pass that holds the GIL little: CUDA graphs).
2026-12-06 22:08, the engine in a process of its own (``--engine process``,
``verlog.backends.engine_process``) beside the in-process engine in one run (load 0.7-1.0, nothing
else running): in process 7.8x, 8.9x, 8.9x (63-67% of the ceiling, 154-156 turns/s, 1.00-1.01 cores
busy); its own process 8.9x, 9.4x, 10.2x (85-86% of the ceiling, 161-196 turns/s, the graphs' process
0.38-0.40 cores busy). The engine then decodes smaller batches (21-22 requests per pass against
29-30): it no longer waits for the graphs' Python between steps.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import time

import torch
from rollout_overhead import build_loop, start

from verlog.backends.base import SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.engine_process import EngineProcess
from verlog.llm import VerlogChatModel
from verlog.models import load_causal_lm, load_tokenizer
from verlog.rollout import run_episodes
from verlog.testing.scripted_engine import ScriptedEngine


async def turns_per_second(
    engine, tokenizer, episodes: int, turns: int, concurrency: int, max_tokens: int
) -> tuple[float, float, float]:
    """Turns/s, requests per forward pass (0 for an engine keeping no stats) and the cores the
    process kept busy on average (its CPU time, every thread's, over the wall time)."""
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, max_tokens=max_tokens)
    graph = build_loop(model, turns, report=True)
    stats = getattr(engine, "stats", None)  # the scripted engine keeps none
    before = (stats.steps, stats.generated_tokens) if stats else (0, 0)
    t0, cpu0 = time.perf_counter(), time.process_time()
    results = await run_episodes(
        graph, [start(turns)] * episodes, concurrency=concurrency, graph_config={"recursion_limit": 10 * turns}
    )
    elapsed = time.perf_counter() - t0
    cores = (time.process_time() - cpu0) / elapsed
    done = sum(len(e.turns) for e in results)
    assert done == episodes * turns and not any(e.failed for e in results)
    if stats is None:
        return done / elapsed, 0.0, cores
    stats = engine.stats  # (a process engine's is a copy of the child's counters)
    steps = stats.steps - before[0]
    return done / elapsed, (stats.generated_tokens - before[1]) / max(steps, 1), cores


async def decode_step_ms(engine, rows: int, prompt_tokens: int = 160, new_tokens: int = 48) -> float:
    """The engine's own time per decode step with ``rows`` requests started together (no games,
    no graph: what batching can gain at best with that many rows in every step)."""
    g = torch.Generator().manual_seed(rows)
    prompts = [torch.randint(10, 1000, (prompt_tokens,), generator=g).tolist() for _ in range(rows)]
    before = copy.copy(engine.stats)  # (the in-process engine counts on in the same object)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])
    after = engine.stats
    return 1000 * (after.decode_s - before.decode_s) / max(after.steps - before.steps, 1)


def ceiling(rows: float, one_row_ms: float, full_ms: float, full_rows: int) -> float:
    """What batching can gain on decoding alone with ``rows`` rows in every step: a step's cost
    grows about linearly with its rows, ``t(B) = t(1) + (B - 1) * per_row``."""
    per_row = (full_ms - one_row_ms) / (full_rows - 1)
    return rows * one_row_ms / (one_row_ms + (rows - 1) * per_row)


#: where the engine runs: on a thread of this process, or in a process of its own
ENGINES = {"thread": EmbeddedEngine, "process": EngineProcess}


async def measure(kind: str, episodes: int, turns: int, max_tokens: int, repeats: int) -> tuple[float, float]:
    """The batching speed-up and its share of the decode ceiling (medians) of one engine kind."""
    tokenizer = load_tokenizer("tiny")
    engine = ENGINES[kind](load_causal_lm("tiny"), tokenizer, max_batch_size=episodes)
    await turns_per_second(engine, tokenizer, 2, 2, 2, max_tokens)  # warm-up
    print(f"engine on {'a thread of this process' if kind == 'thread' else 'a process of its own'}:")
    ratios, shares = [], []
    try:
        for repeat in range(repeats):
            batched, mean_batch, cores = await turns_per_second(
                engine, tokenizer, episodes, turns, episodes, max_tokens
            )
            single, _, _ = await turns_per_second(engine, tokenizer, episodes, turns, 1, max_tokens)
            one_row = min([await decode_step_ms(engine, 1) for _ in range(3)])
            full = min([await decode_step_ms(engine, episodes) for _ in range(3)])
            ratio, bound = batched / single, ceiling(mean_batch, one_row, full, episodes)
            ratios.append(ratio)
            shares.append(ratio / bound)
            busy = f"{cores:.2f} cores busy" if kind == "thread" else f"{cores:.2f} cores busy in the graphs' process"
            print(
                f"  run {repeat + 1}: {episodes} concurrent episodes {batched:6.1f} turns/s ({mean_batch:.1f} requests "
                f"per forward pass, {busy}), 1 at a time {single:5.1f} turns/s: {ratio:.1f}x; engine alone "
                f"{one_row:.2f} ms per decode step with 1 row, {full:.2f} ms with {episodes}: ceiling {bound:.1f}x at "
                f"{mean_batch:.1f} rows ({ceiling(episodes, one_row, full, episodes):.1f}x with every step full); "
                f"{ratio / bound:.0%} of it"
            )
    finally:
        engine.close()
    return statistics.median(ratios), statistics.median(shares)


async def main(episodes: int, turns: int, max_tokens: int, repeats: int, engines: list[str]) -> None:
    print(f"tiny model, {episodes * turns} turns of up to {max_tokens} tokens each, {repeats} side-by-side repeats")
    results = {kind: await measure(kind, episodes, turns, max_tokens, repeats) for kind in engines}
    # the same episodes with an engine that answers at once: what the event loop alone can drive
    # (graph supersteps, chat template and tokenizer, turn recording all run on it)
    tokenizer = load_tokenizer("tiny")
    scripted = ScriptedEngine(tokenizer, ["I move forward now and then I look around me."])
    loop_only, _, _ = await turns_per_second(scripted, tokenizer, episodes, turns, episodes, max_tokens)
    for kind, (ratio, share) in results.items():
        print(
            f"engine on a {kind:7s}: batching speed-up (median) {ratio:.1f}x (target >= 8x) "
            f"{'OK' if ratio >= 8 else 'MISSED'}; {share:.0%} of the decode ceiling (target >= 85%) "
            f"{'OK' if share >= 0.85 else 'MISSED'}"
        )
    print(f"event loop alone (an engine that answers at once): {loop_only:.1f} turns/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side runs (the median is the result)")
    parser.add_argument(
        "--engine",
        choices=[*ENGINES, "both"],
        default="both",
        help="where the engine runs: a thread of this process, a process of its own, or both one after the other",
    )
    args = parser.parse_args()
    engines = list(ENGINES) if args.engine == "both" else [args.engine]
    asyncio.run(main(args.episodes, args.turns, args.max_tokens, args.repeats, engines))
