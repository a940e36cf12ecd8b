"""Load test of `verlog serve-model` from a second process, over loopback only.

Starts `python -m verlog.serve serve-model tiny` on 127.0.0.1 (or uses --url, which must be a
loopback address), then sends a bounded number of chat-completion requests (--requests) from
this process with --concurrency in flight, for at most --duration-s seconds. A fraction of them
(--bad-fraction) are bad on purpose (unknown model, wrong schema, oversized prompt) and must get
a 4xx while the good ones keep getting 200. Prints requests/s, latency p50/p90/p99, tokens/s,
and (with --stream) time to first token.

With --flood it measures instead what a flood of large bodies does to good requests (TARGETS
P10): the latency of small good requests sent one at a time, first on an idle server, then while
--flood-clients clients keep sending ~1 MB prompts (each refused: too long for the model); it
prints both p50s side by side, their ratio, the flood's statuses and the server's memory.

Usage: python benchmarks/serve_load.py [--requests 200] [--concurrency 16] [--max-tokens 16]
       [--duration-s 60] [--stream] [--bad-fraction 0.1] [--url http://127.0.0.1:8000]
       python benchmarks/serve_load.py --flood [--good-requests 60] [--flood-clients 8]
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
from typing import Any
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


async def one(
    session: aiohttp.ClientSession, url: str, body: dict, stream: bool
) -> tuple[int, float, float | None, int]:
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
        await one(
            session, url, {"model": args.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, False
        )

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
                    "messages": [
                        {"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": f"Request {i}: describe room {rng.randint(1, 999)}."},
                    ],
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
    print(
        f"{sent} requests ({ok} good answered) in {elapsed:.1f} s, concurrency {args.concurrency}, "
        f"max_tokens {args.max_tokens}{', streaming' if args.stream else ''}"
    )
    print(f"  statuses            : {dict(sorted(statuses.items()))}")
    print(f"  requests/s (all)    : {sent / elapsed:8.1f}")
    print(f"  requests/s (good)   : {ok / elapsed:8.1f}")
    print(
        f"  latency p50/p90/p99 : {1000 * percentile(latencies, 0.5):.0f} / {1000 * percentile(latencies, 0.9):.0f}"
        f" / {1000 * percentile(latencies, 0.99):.0f} ms"
    )
    print(f"  generated tokens/s  : {tokens / elapsed:8.1f}")
    if ttfts:
        print(
            f"  time to first token : p50 {1000 * percentile(ttfts, 0.5):.0f} ms, "
            f"p99 {1000 * percentile(ttfts, 0.99):.0f} ms"
        )
    bad_ok = all(k.startswith("bad->4") for k in statuses if k.startswith("bad"))
    good_ok = all(k == "good->200" for k in statuses if k.startswith("good"))
    print(
        f"  bad requests got 4xx: {'yes' if bad_ok else 'NO'}; every good request got 200: {'yes' if good_ok else 'NO'}"
    )


def rss_mb(pid: int | None) -> float | None:
    """The resident memory of process ``pid`` in MB (Linux), or ``None``."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, TypeError):
        pass
    return None


def large_prompt_body(model: str, size: int) -> bytes:
    """A chat request whose one message is ~``size`` bytes of ordinary words (far over any context)."""
    words = " ".join(f"room{i % 997} door{i % 13}" for i in range(size // 8))
    message = {"role": "user", "content": words}
    head = len(json.dumps({"model": model, "messages": []})) + 2
    message["content"] = words[: size - head - 40]
    return json.dumps({"model": model, "messages": [message], "max_tokens": 16}).encode()


async def _flood_clients(url: str, headers: dict[str, str], body: bytes, clients: int, stop: Any, out: Any) -> None:
    """``clients`` connections posting ``body`` over and over until ``stop`` is set; puts the
    statuses and the answers' latencies on ``out``."""
    statuses: Counter[str] = Counter()
    latencies: list[float] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    statuses[str(r.status)] += 1
                    if r.status == 429:  # as a client would: back off for a moment
                        await asyncio.sleep(0.05)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - started)

    async with aiohttp.ClientSession(
        headers=headers, timeout=aiohttp.ClientTimeout(total=300), connector=aiohttp.TCPConnector(limit=clients)
    ) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    out.put((dict(statuses), latencies))


def _flood_process(url: str, headers: dict[str, str], body: bytes, clients: int, stop: Any, out: Any) -> None:
    asyncio.run(_flood_clients(url, headers, body, clients, stop, out))


async def flood(args: argparse.Namespace, base_url: str, pid: int | None) -> None:
    """Good requests' latency, idle and during a flood of large bodies sent by other clients (a
    second process), in one run."""
    import multiprocessing

    url = f"{base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    good = {
        "model": args.model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Describe the room."},
        ],
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
    }
    big = large_prompt_body(args.model, args.flood_body_bytes)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def good_latencies(n: int) -> tuple[list[float], Counter[int]]:
            out, statuses = [], Counter()
            for _ in range(n):
                status, latency, _, _ = await one(session, url, good, False)
                statuses[status] += 1
                if status == 200:
                    out.append(latency)
            return out, statuses

        await good_latencies(5)  # warm-up (not measured)
        rss_idle = rss_mb(pid)
        idle, idle_statuses = await good_latencies(args.good_requests)

        context = multiprocessing.get_context("spawn")
        stop, results = context.Event(), context.Queue()
        flooders = context.Process(target=_flood_process, args=(url, headers, big, args.flood_clients, stop, results))
        flooders.start()
        await asyncio.sleep(3.0)  # the flood is under way
        started = time.perf_counter()
        during, during_statuses = await good_latencies(args.good_requests)
        elapsed = time.perf_counter() - started
        rss_flood = rss_mb(pid)
        stop.set()
        flood_statuses, flood_latency = await asyncio.to_thread(results.get, True, 120)
        flooders.join(timeout=30)
        after, _ = await good_latencies(10)
    sent = sum(flood_statuses.values())
    p50_idle, p50_flood = percentile(idle, 0.5), percentile(during, 0.5)
    print(
        f"good requests: {args.good_requests} one at a time, max_tokens {args.max_tokens}; flood: {args.flood_clients} "
        f"clients (another process) sending {len(big) / 1e6:.2f} MB prompts"
    )
    print(
        f"  good p50 / p90 idle        : {1000 * p50_idle:8.0f} / {1000 * percentile(idle, 0.9):.0f} ms  "
        f"(statuses {dict(idle_statuses)})"
    )
    print(
        f"  good p50 / p90 during flood: {1000 * p50_flood:8.0f} / {1000 * percentile(during, 0.9):.0f} ms  "
        f"(statuses {dict(during_statuses)})"
    )
    print(f"  ratio (flood / idle p50)   : {p50_flood / p50_idle:8.2f}x")
    print(
        f"  flood                      : {sent} large bodies answered, {sent / (elapsed + 3.0):.0f}/s, statuses "
        f"{dict(sorted(flood_statuses.items()))}, p50 answer {1000 * percentile(flood_latency, 0.5):.0f} ms"
    )
    if rss_idle is not None and rss_flood is not None:
        print(
            f"  server RSS                 : {rss_idle:.0f} MB idle, {rss_flood:.0f} MB during the flood, "
            f"{rss_mb(pid):.0f} MB after"
        )
    print(f"  after the flood            : p50 {1000 * percentile(after, 0.5):.0f} ms")
    bad = [k for k in flood_statuses if not k.startswith("4")]
    print(
        f"  every large body refused with a 4xx: {'yes' if not bad else 'NO ' + str(bad)}; every good request got "
        f"200: {'yes' if set(idle_statuses) | set(during_statuses) == {200} else 'NO'}"
    )


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
    parser.add_argument(
        "--flood", action="store_true", help="measure good requests idle and during a flood of large bodies (P10)"
    )
    parser.add_argument("--good-requests", type=int, default=60, help="--flood: good requests per phase")
    parser.add_argument("--flood-clients", type=int, default=8, help="--flood: clients sending large bodies")
    parser.add_argument("--flood-body-bytes", type=int, default=1_000_000, help="--flood: size of a large body")
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
        cmd = [
            sys.executable,
            "-m",
            "verlog.serve",
            "serve-model",
            args.checkpoint,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-queue",
            "1024",
        ]
        if args.api_key:
            cmd += ["--api-key", args.api_key]
        process = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stderr=subprocess.DEVNULL)
    try:
        asyncio.run(wait_healthy(base_url, process))
        if args.flood:
            asyncio.run(flood(args, base_url, process.pid if process is not None else None))
        else:
            asyncio.run(load(args, base_url))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
