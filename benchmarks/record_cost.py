"""What `serve-model --record` costs: throughput with recording on vs off, side by side in one run.

Starts two `python -m verlog.serve serve-model` processes on 127.0.0.1 serving the same checkpoint
with the same settings, one with `--record` into a fresh SQLite store (or --record-target, e.g. a
postgresql:// URL), one without. Rounds alternate between them (off, on, off, on, ...) so that the
machine's noise falls on both alike; each round sends --requests chat completions with
--concurrency in flight, episodes named by the OpenAI `user` field (--episodes of them). Prints
each round's completion tokens/s and requests/s, the median of each setting, the cost of recording
(1 - on/off, target <= 10 %), and checks afterwards that the store holds every completion sent.

Usage: python benchmarks/record_cost.py [--checkpoint tiny] [--rounds 4] [--requests 96]
       [--concurrency 16] [--max-tokens 16] [--stream] [--record-target DIR|URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, free_port, one, wait_healthy  # noqa: E402


async def _round(base_url: str, args: argparse.Namespace, tag: str) -> tuple[float, float, int]:
    """(tokens/s, requests/s, errors) of one round against ``base_url``."""
    url = f"{base_url}/v1/chat/completions"
    gate = asyncio.Semaphore(args.concurrency)
    results: list[tuple[int, float, float | None, int]] = []

    async def send(session: aiohttp.ClientSession, i: int) -> None:
        body = {
            "model": args.checkpoint,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "stream": args.stream,
            "messages": [{"role": "user", "content": f"Tell me about item {i} of the list, please."}],
            "user": f"{tag}-episode-{i % args.episodes}",
        }
        if args.stream:
            body["stream_options"] = {"include_usage": True}
        async with gate:
            results.append(await one(session, url, body, args.stream))

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(send(session, i) for i in range(args.requests)))
        wall = time.perf_counter() - started
    tokens = sum(r[3] for r in results if r[0] == 200)
    return tokens / wall, len(results) / wall, sum(r[0] != 200 for r in results)


def _serve(checkpoint: str, port: int, record: str | None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "verlog.serve",
        "serve-model",
        checkpoint,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-queue",
        "1024",
        "--device",
        "cpu",
    ]
    if record:
        cmd += ["--record", record]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="tiny")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per setting (alternating)")
    parser.add_argument("--requests", type=int, default=96, help="requests per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=8, help="episodes the requests of a round are filed under")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--record-target", default=None, help="the trace store (default: a fresh temporary folder)")
    args = parser.parse_args()

    target = args.record_target or tempfile.mkdtemp(prefix="verlog-record-cost-")
    ports = {"off": free_port(), "on": free_port()}
    servers = {"off": _serve(args.checkpoint, ports["off"], None), "on": _serve(args.checkpoint, ports["on"], target)}
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    figures: dict[str, list[tuple[float, float, int]]] = {"off": [], "on": []}
    try:
        for kind in ("off", "on"):
            asyncio.run(wait_healthy(urls[kind], servers[kind]))
            asyncio.run(_round(urls[kind], argparse.Namespace(**{**vars(args), "requests": 16}), "warmup"))
        print(
            f"load {os.getloadavg()[0]:.2f} at start; {args.checkpoint}, {args.rounds} rounds x {args.requests} "
            f"requests, concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
            f"{'streaming' if args.stream else 'non-streaming'}; store {target}"
        )
        for r in range(args.rounds):
            for kind in ("off", "on") if r % 2 == 0 else ("on", "off"):
                tps, rps, errors = asyncio.run(_round(urls[kind], args, f"r{r}"))
                figures[kind].append((tps, rps, errors))
                print(f"round {r + 1} recording {kind:>3}: {tps:8.1f} tokens/s  {rps:6.1f} requests/s  errors {errors}")
    finally:
        for process in servers.values():
            process.terminate()
            process.wait(timeout=30)
    off = statistics.median(f[0] for f in figures["off"])
    on = statistics.median(f[0] for f in figures["on"])
    print(
        f"median tokens/s: recording off {off:.1f}, on {on:.1f}; on/off {on / off:.3f}; "
        f"cost of recording {100 * (1 - on / off):.1f} % (target <= 10 %); load {os.getloadavg()[0]:.2f} at end"
    )
    if not str(target).startswith(("postgresql://", "postgres://")):
        from verlog.traces import open_store

        store = open_store(target)
        recorded = sum(e.turns for e in store.episodes() if not e.episode_id.startswith("warmup"))
        sent = args.rounds * args.requests
        print(f"recorded completions: {recorded} of {sent} sent ({'all' if recorded == sent else 'MISSING SOME'})")
        store.close()


if __name__ == "__main__":
    main()
