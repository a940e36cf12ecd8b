"""`verlog serve --postgres-uri`: threads kept in a team's Postgres, shared by server processes.

Two `verlog serve` processes on one Postgres (a real PostgreSQL server started for the module;
skipped where none is installed, as on CI). An episode runs on the first; the first is killed
with SIGKILL mid-episode; the second, which was already running, continues that thread from the
checkpoint in Postgres, and it ends as the uninterrupted episode of the same seed.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

pytest.importorskip("langgraph.checkpoint.postgres")
pytest.importorskip("langgraph_api")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

from langgraph_server import ROOT, free_port, paced_endpoint, serve_command, server_process  # noqa: E402
from postgres_server import running_postgres  # noqa: E402


@pytest.fixture(scope="module")
def postgres_uri():
    """A PostgreSQL server of this machine's, started in a temporary folder for the module."""
    with running_postgres() as uri:
        yield uri


@pytest.fixture
def slow_endpoint(tiny_model, tiny_tokenizer):
    """A paced endpoint of the test's own (the test drops the pace after its kill)."""
    with paced_endpoint(tiny_model, tiny_tokenizer) as endpoint:
        yield endpoint


async def test_a_second_server_continues_a_killed_servers_thread_from_postgres(postgres_uri, slow_endpoint, tmp_path):
    base_url, engine = slow_endpoint
    cap = 30
    env = {**os.environ, "VERLOG_API_KEY": "", "VERLOG_POSTGRES_URI": postgres_uri}
    first_port, second_port = free_port(), free_port()
    first = serve_command(base_url, first_port, tmp_path / "first", max_steps=cap)
    second = serve_command(base_url, second_port, tmp_path / "second", max_steps=cap)
    with server_process(second, env, ROOT, second_port, tmp_path / "second.log") as (second_url, _):
        with server_process(first, env, ROOT, first_port, tmp_path / "first.log") as (first_url, process):
            client = langgraph_sdk.get_client(url=first_url)
            thread_id = (await client.threads.create())["thread_id"]
            await client.runs.create(thread_id, "babyai", input={"seed": 4})
            while True:
                values = (await client.threads.get_state(thread_id))["values"]
                if values and values.get("steps", 0) >= 5:
                    break
                await asyncio.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        engine.delay_s = 0.0  # the pace only had to outlast the kill
        assert "Postgres" in (tmp_path / "first.log").read_text()
        client = langgraph_sdk.get_client(url=second_url)
        # the second server never saw this thread: it takes it from Postgres and goes on
        resumed = await client.runs.wait(thread_id, "babyai", input=None, if_not_exists="create")
        whole = await client.runs.wait((await client.threads.create())["thread_id"], "babyai", input={"seed": 4})
    assert "__error__" not in resumed, resumed
    assert resumed["steps"] == cap
    for key in ("seed", "steps", "episode_return", "observation", "actions", "history"):
        assert resumed[key] == whole[key], key
