"""`verlog serve` plays whole episodes, in every stream mode, across a restart of the server, and
across a crash (SIGKILL) of it.

graphs/babyai.py behind LangGraph's server (``verlog serve`` → ``langgraph dev``), its model
``ChatOpenAI`` on ``serve-model``'s API over the tiny random model, whose answers are noise: every
episode runs to BabyAI's 128-step cap. The run's recursion limit is the graph's own (no
``--recursion-limit``), under ``runs.wait`` and under ``runs.stream`` with ``["events"]`` (the
mode that carries the reward events). Then the server is stopped mid-episode and started again
on the same state folder: the thread's run goes on from its checkpoint, its game rebuilt from
the seed and answers the state holds, and ends as the uninterrupted episode of the same seed.
Killed with SIGKILL mid-episode instead, the server comes back with every thread its durable
checkpointer (SQLite in the state folder) kept: the run that was cut off is retried and goes on
from its last checkpoint, a thread created just before the crash is there and can be continued,
and both end as their uninterrupted episodes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from verlog.backends.embedded import EmbeddedEngine
from verlog.serve import OpenAIServer, serve_in_thread

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph_api")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

from langgraph_server import free_port, paced_endpoint, running, serve_command, server_process  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAP = 128  # BabyAI's step cap under verlog's protocol


@pytest.fixture(scope="module")
def endpoint(tiny_model, tiny_tokenizer):
    """serve-model's OpenAI API on the tiny model, for the module's servers."""
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        yield base_url
    engine.close()


@pytest.fixture
def slow_endpoint(tiny_model, tiny_tokenizer):
    """A paced endpoint of the test's own (the test drops the pace after its kill)."""
    with paced_endpoint(tiny_model, tiny_tokenizer) as endpoint:
        yield endpoint


def assert_whole_episode(state: dict) -> None:
    assert "__error__" not in state, state
    assert state["steps"] == CAP and state["done"] and len(state["history"]) == CAP
    assert not state["info"]["success"], state["info"]


async def test_a_served_babyai_episode_runs_to_its_cap_under_wait_and_event_streaming(endpoint, tmp_path):
    port = free_port()
    env = {**os.environ, "VERLOG_API_KEY": ""}
    with running(serve_command(endpoint, port, tmp_path / "state"), env, ROOT, port, tmp_path / "server.log") as url:
        client = langgraph_sdk.get_client(url=url)
        thread = await client.threads.create()
        state = await client.runs.wait(thread["thread_id"], "babyai", input={"seed": 0})
        assert_whole_episode(state)

        thread = await client.threads.create()
        rewards, ends, errors = 0, [], []
        async for part in client.runs.stream(thread["thread_id"], "babyai", input={"seed": 1}, stream_mode=["events"]):
            if (
                part.event == "events"
                and part.data.get("event") == "on_custom_event"
                and part.data.get("name") == "verlog.reward"
            ):
                rewards += 1
            elif (
                part.event == "events"
                and part.data.get("event") == "on_chain_end"
                and part.data.get("name") == "babyai"
            ):
                ends.append(part.data["data"]["output"])
            elif part.event == "error":
                errors.append(part.data)
        assert not errors, errors
        assert rewards == CAP  # one reward event per environment step, every step of the episode
        assert_whole_episode((await client.threads.get_state(thread["thread_id"]))["values"])


@pytest.mark.slow
async def test_a_thread_goes_on_after_the_server_restarts(endpoint, tmp_path):
    env = {**os.environ, "VERLOG_API_KEY": ""}
    state_dir = tmp_path / "state"
    port = free_port()
    with running(serve_command(endpoint, port, state_dir), env, ROOT, port, tmp_path / "first.log") as url:
        client = langgraph_sdk.get_client(url=url)
        thread_id = (await client.threads.create())["thread_id"]
        await client.runs.create(thread_id, "babyai", input={"seed": 2})
        for _ in range(600):  # until the episode is well under way
            values = (await client.threads.get_state(thread_id))["values"]
            if values and values.get("steps", 0) >= 20:
                break
            await asyncio.sleep(0.1)
        assert 20 <= values["steps"] < CAP
    # the server is gone (stopped mid-episode); a new one on the same state folder
    port = free_port()
    with running(serve_command(endpoint, port, state_dir), env, ROOT, port, tmp_path / "second.log") as url:
        client = langgraph_sdk.get_client(url=url)
        saved = (await client.threads.get_state(thread_id))["values"]
        assert 20 <= saved["steps"] < CAP and not saved["done"]  # the checkpoint survived the restart
        resumed = await client.runs.wait(thread_id, "babyai", input=None)  # go on from the checkpoint
        # the same episode, uninterrupted, on a thread of its own
        whole = await client.runs.wait((await client.threads.create())["thread_id"], "babyai", input={"seed": 2})
    assert_whole_episode(resumed)
    assert_whole_episode(whole)
    for key in ("seed", "steps", "episode_return", "observation", "actions", "history"):
        assert resumed[key] == whole[key], key


async def _steps(client, thread_id: str) -> int:
    values = (await client.threads.get_state(thread_id))["values"]
    return values.get("steps", 0) if values else 0


async def test_episodes_survive_a_sigkill_of_the_server(slow_endpoint, tmp_path):
    base_url, engine = slow_endpoint
    cap = 40  # steps of these episodes (max_steps), ~0.3 s each
    env = {**os.environ, "VERLOG_API_KEY": ""}
    state_dir = tmp_path / "state"
    command = lambda port: serve_command(base_url, port, state_dir, max_steps=cap)  # noqa: E731
    ops = state_dir / ".langgraph_api" / ".langgraph_ops.pckl"  # the server's records of threads and runs

    port = free_port()
    with server_process(command(port), env, ROOT, port, tmp_path / "first.log") as (url, process):
        client = langgraph_sdk.get_client(url=url)
        cut = (await client.threads.create())["thread_id"]
        run = await client.runs.create(cut, "babyai", input={"seed": 2})
        created = time.time()
        # the server writes its records every 10 s: once it has written this run's, start a
        # thread it will not have written when it is killed
        while not (ops.exists() and ops.stat().st_mtime > created + 0.5):
            await asyncio.sleep(0.1)
        fresh = (await client.threads.create())["thread_id"]
        await client.runs.create(fresh, "babyai", input={"seed": 3})
        while await _steps(client, fresh) < 2:
            await asyncio.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)  # mid-episode, no shutdown of any kind
        process.wait(timeout=10)
    engine.delay_s = 0.0  # the pace only had to outlast the kill; what follows runs at the tiny model's
    assert "threads kept in" in (tmp_path / "first.log").read_text()

    port = free_port()
    with server_process(command(port), env, ROOT, port, tmp_path / "second.log") as (url, _):
        client = langgraph_sdk.get_client(url=url)
        saved = await _steps(client, cut)
        assert 0 < saved < cap  # the checkpoint of the cut-off step survived the kill
        calls = engine.calls
        # the run the kill cut off is retried by the server and goes on from that checkpoint
        await client.runs.join(cut, run["run_id"])
        cut_state = (await client.threads.get_state(cut))["values"]
        assert cut_state["steps"] == cap and cut_state["done"]
        assert engine.calls - calls <= cap - saved + 1  # the steps left (and the one cut), not the whole episode
        # the thread created just before the kill is there (restored from the checkpointer) and goes on
        assert 0 < await _steps(client, fresh) < cap
        fresh_state = await client.runs.wait(fresh, "babyai", input=None)
        # both end as their uninterrupted episodes
        whole = {
            seed: await client.runs.wait((await client.threads.create())["thread_id"], "babyai", input={"seed": seed})
            for seed in (2, 3)
        }
    assert "restored from the checkpointer" in (tmp_path / "second.log").read_text()
    for state, seed in ((cut_state, 2), (fresh_state, 3)):
        assert "__error__" not in state, state
        for key in ("seed", "steps", "episode_return", "observation", "actions", "history"):
            assert state[key] == whole[seed][key], (seed, key)
