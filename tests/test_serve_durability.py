"""`serve-model --record` killed or stopped under load loses nothing it acknowledged.

* SIGKILL while 16 clients send completions (``benchmarks/record_durability.py``'s trial, one
  short one here): every completion a client was answered is in the store.
* With a write-behind window (``--record-write-behind-s``), SIGTERM writes what the window holds
  before the process exits.

Real ``serve-model`` processes on 127.0.0.1 with the tiny model; the store is read afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from langgraph_server import free_port, server_process

from verlog.traces import open_store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_9_under_16_clients_loses_no_acknowledged_completion():
    from record_durability import kill_trial

    args = argparse.Namespace(checkpoint="tiny", seconds=6.0, concurrency=16, max_tokens=8, write_behind_s=0.0)
    figures = kill_trial(args, 0)
    assert figures["acknowledged"] > 16, figures  # the server was under load when it was killed
    assert figures["missing"] == 0, figures


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_writes_the_write_behind_window(tmp_path):
    store, port = tmp_path / "traces", free_port()
    command = [
        sys.executable,
        "-m",
        "verlog.serve",
        "serve-model",
        "tiny",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--record",
        str(store),
        "--record-write-behind-s",
        "30",
    ]
    with server_process(
        command, dict(os.environ), ROOT, port, tmp_path / "server.log", ready="/health", ready_timeout_s=120
    ) as (url, process):

        async def send() -> None:
            async with aiohttp.ClientSession() as session:
                for i in range(5):
                    body = {
                        "model": "tiny",
                        "max_tokens": 4,
                        "user": f"w{i}",
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                async with session.get(f"{url}/health") as r:  # answered, not all written yet (30 s window)
                    recording = (await r.json())["recording"]
                    assert recording["durable"] is False and recording["written"] < 5, recording

        asyncio.run(send())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    reader = open_store(store, create=False)
    assert sorted(e.episode_id for e in reader.episodes()) == [f"w{i}" for i in range(5)]
    reader.close()
