"""The production loop end to end: serve, record, feedback, train from traces, swap, serve again.

``verlog serve-model toy --record STORE --reload-from RUN`` runs as its own process. The cue
corridor graph plays an episode against it through LangChain's ``ChatOpenAI`` (its turns filed
under the episode named by the OpenAI ``user`` field); feedback posts the outcome; ``verlog
train`` makes one update from the traces alone (``data.traces``); ``POST /v1/admin/reload`` puts
that checkpoint in service; a second episode is served by the new version. Every recorded turn
is byte-equal to what the client received, and its logprobs equal a teacher-forced pass of the
version that served it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
import torch
from langchain_core.callbacks import BaseCallbackHandler
from langgraph_server import free_port, server_process
from rich.console import Console

from verlog.backends.token_bytes import TokenBytes
from verlog.config import load_config
from verlog.graph_file import load_graph_file
from verlog.testing.teacher_forced import teacher_forced_logprobs
from verlog.traces import open_store, send_feedback
from verlog.train import train
from verlog.weights.policy import find_policy, load_policy

langchain_openai = pytest.importorskip("langchain_openai")

ROOT = Path(__file__).resolve().parents[1]


class _Received(BaseCallbackHandler):
    """What the client received from each model call: the answer and its per-token logprobs."""

    def __init__(self) -> None:
        self.messages: list = []

    def on_llm_end(self, response, **kwargs) -> None:
        self.messages.append(response.generations[0][0].message)


async def _episode(base_url: str, episode: str, seed: int) -> tuple[dict, list]:
    """One corridor episode through ChatOpenAI, its turns filed under ``episode``."""
    graph_file = load_graph_file(ROOT / "graphs" / "cue_corridor.py")
    model = langchain_openai.ChatOpenAI(
        base_url=base_url, api_key="key", model="toy", temperature=1.0, logprobs=True, max_retries=0
    ).bind(user=episode)
    graph = graph_file.build(model, length=4, max_turns=6)
    received = _Received()
    final = await graph.ainvoke(graph_file.episode_input(seed), {"recursion_limit": 50, "callbacks": [received]})
    return final, received.messages


@pytest.mark.timeout(600)
async def test_serve_record_feedback_train_swap_serve(tmp_path):
    store_dir, run_dir, port = tmp_path / "traces", tmp_path / "run", free_port()
    env = {**os.environ, "VERLOG_API_KEY": "key"}
    command = [
        sys.executable,
        "-m",
        "verlog.serve",
        "serve-model",
        "toy",
        "--port",
        str(port),
        "--record",
        str(store_dir),
        "--reload-from",
        str(run_dir),
        "--device",
        "cpu",
    ]
    auth = {"Authorization": "Bearer key"}
    with server_process(command, env, ROOT, port, tmp_path / "server.log", ready="/health", ready_timeout_s=120) as (
        url,
        _,
    ):
        base_url = f"{url}/v1"
        first_version = httpx.get(f"{url}/health", timeout=10).json()["version"]
        # no checkpoint in the run yet: a reload says so and keeps serving
        refused = httpx.post(f"{base_url}/admin/reload", headers=auth, timeout=60)
        assert refused.status_code == 409 and "no checkpoint" in refused.json()["error"]["message"]

        final, first_received = await _episode(base_url, "episode-1", seed=11)
        send_feedback(
            base_url, "episode-1", 1.0 if final["pos"] >= 4 else 0.0, success=final["pos"] >= 4, api_key="key"
        )
        assert (
            httpx.post(f"{base_url}/feedback", json={"episode_id": "episode-1", "reward": 1}, timeout=10).status_code
            == 401
        )  # authenticated like the rest of the API

        # one update from the traces alone, written as a checkpoint of the run
        config = load_config(
            ROOT / "configs" / "cue_corridor.yaml",
            [
                f"trainer.run_dir={run_dir}",
                "wandb.mode=disabled",
                f"data.traces.store={store_dir}",
                "trainer.total_updates=1",
                "trainer.num_envs=1",
                f"trainer.turns_per_env={len(first_received)}",
                "trainer.save_every=1",
                "critic_warmup.buffer_multiplier=0",
                "eval.at_start=false",
                "eval.at_end=false",
                "algorithm.mini_batch_turns=8",
                "algorithm.ppo_epochs=1",
            ],
        )
        result = await asyncio.to_thread(train, config, console=Console(quiet=True))
        logged = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        assert result.updates == 1 and logged["trace_turns"] == len(first_received) == logged["trace_episodes"] * len(
            first_received
        )
        assert 0 < result.history[0]["behaviour_weight"] <= 2.0  # decoupled PPO's truncated importance weight

        swapped = httpx.post(f"{base_url}/admin/reload", headers=auth, timeout=120).json()
        second_version = f"{run_dir.name}/update_000001"
        assert swapped == {"object": "reload", "version": second_version, "previous": first_version, "swapped": True}
        final, second_received = await _episode(base_url, "episode-2", seed=12)
        send_feedback(base_url, "episode-2", 0.0, success=False, api_key="key")

    store = open_store(store_dir)
    first_model, tokenizer = load_policy(find_policy("toy"))
    second_model, _ = load_policy(find_policy(run_dir))
    assert any(not torch.equal(a, b) for a, b in zip(first_model.parameters(), second_model.parameters()))
    token_bytes = TokenBytes(tokenizer)
    for episode, received, version, model in (
        ("episode-1", first_received, first_version, first_model),
        ("episode-2", second_received, second_version, second_model),
    ):
        turns = store.turns(episode)
        assert len(turns) == len(received) > 0 and store.episode(episode).has_feedback
        for turn, message in zip(turns, received):
            assert turn.model_version == version
            # byte-equal to what the client received: the text, and each token's bytes and logprob
            entries = message.response_metadata["logprobs"]["content"]
            assert turn.response_text == message.content
            assert [bytes(e["bytes"]) for e in entries] == [token_bytes(i) for i in turn.response_ids]
            assert [e["logprob"] for e in entries] == turn.logprobs
            # the behaviour logprobs are the serving version's own
            assert turn.logprobs == pytest.approx(
                teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids, turn.temperature), abs=1e-4
            )
    # and not the other version's: the update moved what the second episode was sampled from
    second_turns = store.turns("episode-2")
    other = [
        lp
        for t in second_turns
        for lp in teacher_forced_logprobs(first_model, t.prompt_ids, t.response_ids, t.temperature)
    ]
    assert other != pytest.approx([lp for t in second_turns for lp in t.logprobs], abs=1e-4)
    store.close()
