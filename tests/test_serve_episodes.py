"""`verlog serve` plays whole episodes, in every stream mode, and across a restart of the server.

graphs/babyai.py behind LangGraph's server (``verlog serve`` → ``langgraph dev``), its model
``ChatOpenAI`` on ``serve-model``'s API over the tiny random model, whose answers are noise: every
episode runs to BabyAI's 128-step cap. The run's recursion limit is the graph's own (no
``--recursion-limit``), under ``runs.wait`` and under ``runs.stream`` with ``["events"]`` (the
mode that carries the reward events). Then the server is stopped mid-episode and started again
on the same state folder: the thread's run goes on from its checkpoint, its game rebuilt from
the seed and answers the state holds, and ends as the uninterrupted episode of the same seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from verlog.backends.embedded import EmbeddedEngine
from verlog.serve import OpenAIServer, serve_in_thread

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph_api")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

from langgraph_server import free_port, running  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "babyai.py"
CAP = 128  # BabyAI's step cap under verlog's protocol


@pytest.fixture(scope="module")
def endpoint(tiny_model, tiny_tokenizer):
    """serve-model's OpenAI API on the tiny model, for the module's servers."""
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        yield base_url
    engine.close()


def serve_command(base_url: str, port: int, state_dir: Path) -> list[str]:
    # short answers (the tiny model's are noise anyway); seeded sampling: the same episode each time
    return [sys.executable, "-m", "verlog.serve", "serve", str(GRAPH), "--base-url", base_url, "--model", "tiny",
            "--temperature", "1", "--seed", "5", "--port", str(port), "--state-dir", str(state_dir),
            "--graph-kwargs", json.dumps({"max_tokens": 3})]


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
        async for part in client.runs.stream(thread["thread_id"], "babyai", input={"seed": 1},
                                             stream_mode=["events"]):
            if part.event == "events" and part.data.get("event") == "on_custom_event" \
                    and part.data.get("name") == "verlog.reward":
                rewards += 1
            elif part.event == "events" and part.data.get("event") == "on_chain_end" \
                    and part.data.get("name") == "babyai":
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
