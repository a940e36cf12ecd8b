"""Load test of `verlog serve-model` from a second process, over loopback only.

Starts `python -m verlog.serve serve-model tiny` on 127.0.0.1 (or uses --url, which must be a
loopback address), then sends a bounded number of chat-completion requests (--requests) from
this process with --concurrency in flight, for at most --duration-s seconds. A fraction of them
(--bad-fraction) are bad on purpose (unknown model, wrong schema, oversized prompt) and must get
a 4xx while the good ones keep getting 200. Prints requests/s, latency p50/p90/p99, tokens/s,
and (with --stream) time to first token.

Usage: python benchmarks/serve_load.py [--requests 200] [--concurrency 16] [--max-tokens 16]
       [--duration-s 60] [--stream] [--bad-fraction 0.1] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def bad_request(i: int, model: str) -> dict:
    kind = i % 3
    if kind == 0:
        return {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    if kind == 1:
        return {"model": model, "messages": [{"role": "robot", "content": "hi"}]}
    return {"model": model, "messages": [{"role": "user", "content": "many words " * 5000}]}


async def one(session: aiohttp.ClientSession, url: str, body: dict, stream: bool) -> tuple[int, float, float | None, int]:
    """(status, latency s, time to first content s, completion tokens)."""
    started = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(url, json=body) as response:
        if response.status != 200 or not stream:
            payload = await response.json()
            if response.status == 200:
                tokens = payload["usage"]["completion_tokens"]
            return response.status, time.perf_counter() - started, None, tokens
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if first is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter() - started
    return 200, time.perf_counter() - started, first, tokens


async def load(args: argparse.Namespace, base_url: str) -> None:
    url = f"{base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rng = random.Random(0)
    plan = ["bad" if rng.random() < args.bad_fraction else "good" for _ in range(args.requests)]
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    ttfts: list[float] = []
    tokens = 0
    next_index = 0
    deadline = time.perf_counter() + args.duration_s
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        # warm-up (not measured)
        await one(session, url, {"model": args.model, "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 4}, False)

        async def worker() -> None:
            nonlocal next_index, tokens
            while next_index < len(plan) and time.perf_counter() < deadline:
                i = next_index
                next_index += 1
                if plan[i] == "bad":
                    status, _, _, _ = await one(session, url, bad_request(i, args.model), False)
                    statuses[f"bad->{status}"] += 1
                    continue
                body = {
                    "model": args.model,
                    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": f"Request {i}: describe room {rng.randint(1, 999)}."}],
                    "max_tokens": args.max_tokens,
                    "temperature": 1.0,
                }
                if args.stream:
                    body.update(stream=True, stream_options={"include_usage": True})
                try:
                    status, latency, first, n = await one(session, url, body, args.stream)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    statuses[f"good->{type(exc).__name__}"] += 1
                    continue
                statuses[f"good->{status}"] += 1
                if status == 200:
                    latencies.append(latency)
                    tokens += n
                    if first is not None:
                        ttfts.append(first)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - started
    sent = sum(statuses.values())
    ok = len(latencies)
    print(f"{sent} requests ({ok} good answered) in {elapsed:.1f} s, concurrency {args.concurrency}, "
          f"max_tokens {args.max_tokens}{', streaming' if args.stream else ''}")
    print(f"  statuses            : {dict(sorted(statuses.items()))}")
    print(f"  requests/s (all)    : {sent / elapsed:8.1f}")
    print(f"  requests/s (good)   : {ok / elapsed:8.1f}")
    print(f"  latency p50/p90/p99 : {1000 * percentile(latencies, 0.5):.0f} / {1000 * percentile(latencies, 0.9):.0f}"
          f" / {1000 * percentile(latencies, 0.99):.0f} ms")
    print(f"  generated tokens/s  : {tokens / elapsed:8.1f}")
    if ttfts:
        print(f"  time to first token : p50 {1000 * percentile(ttfts, 0.5):.0f} ms, "
              f"p99 {1000 * percentile(ttfts, 0.99):.0f} ms")
    bad_ok = all(k.startswith("bad->4") for k in statuses if k.startswith("bad"))
    good_ok = all(k == "good->200" for k in statuses if k.startswith("good"))
    print(f"  bad requests got 4xx: {'yes' if bad_ok else 'NO'}; every good request got 200: "
          f"{'yes' if good_ok else 'NO'}")


async def wait_healthy(base_url: str, process: subprocess.Popen | None, timeout_s: float = 120) -> None:
    deadline = time.perf_counter() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() < deadline:
            if process is not None and process.poll() is not None:
                raise SystemExit(f"the server exited with {process.returncode}")
            try:
                async with session.get(f"{base_url}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise SystemExit(f"the server at {base_url} did not become healthy in {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="an already running server (loopback only)")
    parser.add_argument("--checkpoint", default="tiny", help="what the started server serves (default tiny)")
    parser.add_argument("--model", default=None, help="model name to request (default: the checkpoint)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--requests", type=int, default=200, help="most requests sent")
    parser.add_argument("--duration-s", type=float, default=60.0, help="stop sending after this long")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--bad-fraction", type=float, default=0.1)
    parser.add_argument("--stream", action="store_true", help="stream the answers (reports time to first token)")
    args = parser.parse_args()
    args.model = args.model or args.checkpoint
    process = None
    if args.url:
        if not is_loopback(args.url):
            raise SystemExit(f"refusing {args.url}: this load test only targets loopback addresses")
        base_url = args.url.rstrip("/").removesuffix("/v1")
    else:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "verlog.serve", "serve-model", args.checkpoint, "--host", "127.0.0.1",
               "--port", str(port), "--max-queue", "1024"]
        if args.api_key:
            cmd += ["--api-key", args.api_key]
        process = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stderr=subprocess.DEVNULL)
    try:
        asyncio.run(wait_healthy(base_url, process))
        asyncio.run(load(args, base_url))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
