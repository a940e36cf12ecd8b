"""Nothing acknowledged is lost: `serve-model --record` killed with SIGKILL under load, and the
rate at which it takes feedback.

**kill -9.** Each trial starts `python -m verlog.serve serve-model CHECKPOINT --record STORE` on
127.0.0.1 (a fresh SQLite store), runs --concurrency clients that each send chat completions one
after the other (every completion an episode of its own, named by the OpenAI `user` field; every
third streamed), and after --seconds kills the server with SIGKILL. A completion is acknowledged
when its client got a 200 and the whole answer (`[DONE]` for a stream). Then the store is opened
and every acknowledged completion looked up: the figure is how many are missing (must be 0);
completions stored but never acknowledged (answered as the kill came) are counted too.

**Feedback rate.** A fresh server records --feedback-episodes completions; then --concurrency
clients post --feedback-posts episode feedbacks (`POST /v1/feedback` with the admin key), and the
posts/s are reported (the store holds the last reward of each episode afterwards).

Usage: python benchmarks/record_durability.py [--checkpoint tiny] [--trials 3] [--seconds 8]
       [--concurrency 16] [--max-tokens 8] [--feedback-posts 2000] [--write-behind-s 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, free_port, wait_healthy  # noqa: E402

ADMIN_KEY = "bench-admin"


def start_server(checkpoint: str, store: str, port: int, write_behind_s: float = 0.0) -> subprocess.Popen:
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
        "--record",
        store,
        "--admin-key",
        ADMIN_KEY,
        "--max-queue",
        "1024",
        "--device",
        "cpu",
        "--record-write-behind-s",
        str(write_behind_s),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stderr=subprocess.DEVNULL)


async def _complete(
    session: aiohttp.ClientSession, url: str, episode: str, checkpoint: str, max_tokens: int, stream: bool
) -> bool:
    """One completion; True when it was acknowledged whole (a 200 and, streamed, its [DONE])."""
    body = {
        "model": checkpoint,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "stream": stream,
        "user": episode,
        "messages": [{"role": "user", "content": f"Say something about {episode}."}],
    }
    async with session.post(url, json=body) as response:
        if response.status != 200:
            return False
        if not stream:
            await response.json()
            return True
        async for line in response.content:
            if line.strip() == b"data: [DONE]":
                return True
    return False


async def _load_until_killed(
    base_url: str, process: subprocess.Popen, args: argparse.Namespace, trial: int
) -> tuple[set[str], int]:
    """Clients send completions until the server is killed; (acknowledged episodes, attempts)."""
    url = f"{base_url}/v1/chat/completions"
    acknowledged: set[str] = set()
    attempts = 0
    stop = asyncio.Event()

    async def client(c: int) -> None:
        nonlocal attempts
        n = 0
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                episode = f"t{trial}-c{c}-n{n}"
                n += 1
                attempts += 1
                try:
                    if await _complete(session, url, episode, args.checkpoint, args.max_tokens, stream=n % 3 == 0):
                        acknowledged.add(episode)
                except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
                    await asyncio.sleep(0.05)

    clients = [asyncio.ensure_future(client(c)) for c in range(args.concurrency)]
    await asyncio.sleep(args.seconds)
    os.kill(process.pid, signal.SIGKILL)  # mid-flight: requests being generated, written, answered
    process.wait()
    stop.set()
    await asyncio.gather(*clients)
    return acknowledged, attempts


def kill_trial(args: argparse.Namespace, trial: int) -> dict[str, int]:
    """One trial (see the module doc): acknowledged, stored, missing, stored but unacknowledged."""
    from verlog.traces import open_store

    folder = tempfile.mkdtemp(prefix="verlog-kill9-")
    port = free_port()
    process = start_server(args.checkpoint, folder, port, args.write_behind_s)
    try:
        asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", process))
        acknowledged, attempts = asyncio.run(_load_until_killed(f"http://127.0.0.1:{port}", process, args, trial))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    store = open_store(folder, create=False)
    stored = {e.episode_id for e in store.episodes()}
    store.close()
    return {
        "attempts": attempts,
        "acknowledged": len(acknowledged),
        "stored": len(stored),
        "missing": len(acknowledged - stored),
        "unacknowledged_stored": len(stored - acknowledged),
    }


async def _feedback_rate(base_url: str, args: argparse.Namespace) -> tuple[float, int, int]:
    """(posts/s, posts answered 200, others) of --feedback-posts feedbacks over --feedback-episodes episodes."""
    episodes = [f"fb-{i}" for i in range(args.feedback_episodes)]
    async with aiohttp.ClientSession() as session:
        gate = asyncio.Semaphore(args.concurrency)

        async def complete(episode: str) -> None:
            async with gate:
                assert await _complete(session, f"{base_url}/v1/chat/completions", episode, args.checkpoint, 4, False)

        await asyncio.gather(*(complete(e) for e in episodes))
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        statuses: list[int] = []
        queue = list(range(args.feedback_posts))

        async def poster() -> None:
            while queue:
                i = queue.pop()
                body = {"episode_id": episodes[i % len(episodes)], "reward": float(i), "success": i % 2 == 0}
                async with session.post(f"{base_url}/v1/feedback", json=body, headers=headers) as r:
                    await r.read()
                    statuses.append(r.status)

        started = time.perf_counter()
        await asyncio.gather(*(poster() for _ in range(args.concurrency)))
        wall = time.perf_counter() - started
    ok = sum(s == 200 for s in statuses)
    return len(statuses) / wall, ok, len(statuses) - ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="tiny")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="load before each kill -9")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--write-behind-s",
        type=float,
        default=0.0,
        help="serve-model's --record-write-behind-s (0: answers wait for their turn to be written)",
    )
    parser.add_argument("--feedback-episodes", type=int, default=64)
    parser.add_argument("--feedback-posts", type=int, default=2000, help="0: skip the feedback rate")
    args = parser.parse_args()

    print(
        f"load {os.getloadavg()[0]:.2f} at start; {args.checkpoint}, {args.concurrency} clients, max_tokens "
        f"{args.max_tokens}, write-behind {args.write_behind_s} s"
    )
    totals = {"acknowledged": 0, "missing": 0}
    for trial in range(args.trials):
        figures = kill_trial(args, trial)
        totals["acknowledged"] += figures["acknowledged"]
        totals["missing"] += figures["missing"]
        print(f"kill -9 trial {trial + 1}: {json.dumps(figures)}")
    print(
        f"kill -9 total: {totals['missing']} of {totals['acknowledged']} acknowledged completions missing from the "
        f"store (must be 0); load {os.getloadavg()[0]:.2f}"
    )
    if args.feedback_posts:
        folder = tempfile.mkdtemp(prefix="verlog-feedback-")
        port = free_port()
        process = start_server(args.checkpoint, folder, port, args.write_behind_s)
        try:
            asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", process))
            rate, ok, other = asyncio.run(_feedback_rate(f"http://127.0.0.1:{port}", args))
        finally:
            process.terminate()
            process.wait(timeout=30)
        print(
            f"feedback: {rate:.0f} posts/s ({ok} answered 200, {other} other), {args.concurrency} clients; "
            f"load {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
