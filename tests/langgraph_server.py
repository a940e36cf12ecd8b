"""Test helpers: a server process for the serving tests (LangGraph's, or serve-model's: started,
awaited, stopped)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from verlog.backends.base import Engine, Generation, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "babyai.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(cmd: list[str], env: dict[str, str], cwd: Path, port: int, log: Path) -> Iterator[str]:
    """Run a LangGraph server process until its ``/ok`` answers; yield its URL; stop it."""
    with server_process(cmd, env, cwd, port, log) as (url, _):
        yield url


@contextmanager
def server_process(
    cmd: list[str],
    env: dict[str, str],
    cwd: Path,
    port: int,
    log: Path,
    *,
    ready: str = "/ok",
    ready_timeout_s: float = 90,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run a server process until its ``ready`` path answers (LangGraph's ``/ok``; serve-model's
    ``/health``); yield its URL and the process (a test may kill it); stop it if it is still running."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class SlowCountingEngine(Engine):
    """The tiny model's engine answering each call ``delay_s`` later (a bigger model's pace, so an
    episode is still running when the server is killed), counting the calls."""

    def __init__(self, inner: Engine, delay_s: float):
        self.inner, self.delay_s, self.calls = inner, delay_s, 0
        self.eos_token_ids = inner.eos_token_ids
        self.max_context = getattr(inner, "max_context", None)

    async def generate(self, prompt_ids, sampling: SamplingParams, *, request_id=None, on_token=None) -> Generation:
        await asyncio.sleep(self.delay_s)
        self.calls += 1
        return await self.inner.generate(prompt_ids, sampling, request_id=request_id)


@contextmanager
def paced_endpoint(model, tokenizer, delay_s: float = 0.25) -> Iterator[tuple[str, SlowCountingEngine]]:
    """``serve-model``'s API on ``model`` answering at a bigger model's pace (``delay_s`` a call):
    its base URL and the engine (set ``engine.delay_s = 0`` once the pace has done its job)."""
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.serve import OpenAIServer, serve_in_thread

    engine = SlowCountingEngine(EmbeddedEngine(model, tokenizer, seed=0), delay_s=delay_s)
    try:
        with serve_in_thread(OpenAIServer(engine, tokenizer, model_name="tiny")) as base_url:
            yield base_url, engine
    finally:
        engine.inner.close()


def serve_command(base_url: str, port: int, state_dir: Path, **graph_kwargs) -> list[str]:
    # short answers (the tiny model's are noise anyway); seeded sampling: the same episode each time
    return [
        sys.executable,
        "-m",
        "verlog.serve",
        "serve",
        str(GRAPH),
        "--base-url",
        base_url,
        "--model",
        "tiny",
        "--temperature",
        "1",
        "--seed",
        "5",
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        "--graph-kwargs",
        json.dumps({"max_tokens": 3, **graph_kwargs}),
    ]
