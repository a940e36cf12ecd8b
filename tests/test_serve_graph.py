"""The same graph file, unchanged, gives the same turns in training and in production.

Training: ``run_episode`` with verlog's chat model on the embedded engine (greedy), each model
call captured as a turn. Production: the graph served by LangGraph's own server (``verlog
serve`` → ``langgraph dev``; and the repo's ``langgraph.json``), its model a plain
``ChatOpenAI`` pointed at ``serve-model``'s OpenAI API on the same engine, driven over HTTP with
LangGraph's SDK. For each episode seed, the engine sees the same prompt ids and produces the
same response ids, call for call: with greedy decoding (``temperature=0``), and with seeded
sampling (``temperature=1, seed=7``), whose varied answers make the graphs take varied paths.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from langgraph_server import free_port, running

from verlog.backends.base import Engine, Generation, SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.rollout import run_episode
from verlog.serve import OpenAIServer, serve_in_thread

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph_api")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

ROOT = Path(__file__).resolve().parents[1]


class RecordingEngine(Engine):
    """Forwards to ``inner`` and records every call's prompt ids and response ids."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.eos_token_ids = inner.eos_token_ids
        self.max_context = getattr(inner, "max_context", None)
        self.calls: list[tuple[list[int], list[int]]] = []

    async def generate(self, prompt_ids, sampling: SamplingParams, *, request_id=None, on_token=None) -> Generation:
        kwargs = {"on_token": on_token} if on_token is not None else {}
        generation = await self.inner.generate(prompt_ids, sampling, request_id=request_id, **kwargs)
        self.calls.append((list(prompt_ids), list(generation.token_ids)))
        return generation


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


async def training_turns(engine, tokenizer, graph_path: Path, seeds, graph_kwargs, **sampling) -> dict[int, Any]:
    graph_file = load_graph_file(graph_path)
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, max_tokens=256, **sampling)
    graph = graph_file.build(model, **graph_kwargs)
    episodes = {}
    for seed in seeds:
        episode = await run_episode(graph, graph_file.episode_input(seed), graph_config={"recursion_limit": 100})
        assert not episode.failed, episode.error
        episodes[seed] = episode
    return episodes


async def served_runs(url: str, graph_id: str, inputs: dict[int, Any], recorder: RecordingEngine):
    """Each seed on its own thread; returns {seed: (engine calls, final state)}."""
    client = langgraph_sdk.get_client(url=url)
    out = {}
    for seed, graph_input in inputs.items():
        thread = await client.threads.create(metadata={"seed": seed})
        before = len(recorder.calls)
        state = await client.runs.wait(thread["thread_id"], graph_id, input=graph_input)
        assert "__error__" not in state, state
        out[seed] = (recorder.calls[before:], state, thread["thread_id"])
    return client, out


def assert_same_turns(episodes, served) -> None:
    for seed, episode in episodes.items():
        calls, _, _ = served[seed]
        trained = [(t.prompt_ids, t.response_ids) for t in episode.turns]
        assert len(calls) == len(trained) > 0, f"seed {seed}: {len(calls)} served calls vs {len(trained)} turns"
        for index, (served_call, turn) in enumerate(zip(calls, trained)):
            assert served_call[0] == turn[0], f"seed {seed}, turn {index}: different prompt ids"
            assert served_call[1] == turn[1], f"seed {seed}, turn {index}: different response ids"


async def test_verlog_serve_runs_babyai_with_the_turns_of_training(engine, tiny_tokenizer, tmp_path):
    graph_path = ROOT / "graphs" / "babyai.py"
    graph_kwargs = {"max_steps": 4, "max_tokens": 24}
    seeds = [0, 1]
    episodes = await training_turns(engine, tiny_tokenizer, graph_path, seeds, graph_kwargs, temperature=0)
    answers = {
        s: [tiny_tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in e.turns]
        for s, e in episodes.items()
    }

    recorder = RecordingEngine(engine)
    server = OpenAIServer(recorder, tiny_tokenizer, model_name="tiny")
    port = free_port()
    with serve_in_thread(server) as base_url:
        cmd = [
            sys.executable,
            "-m",
            "verlog.serve",
            "serve",
            str(graph_path),
            "--base-url",
            base_url,
            "--model",
            "tiny",
            "--temperature",
            "0",
            "--port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
            "--graph-kwargs",
            json.dumps(graph_kwargs),
        ]
        env = {**os.environ, "VERLOG_API_KEY": ""}
        with running(cmd, env, ROOT, port, tmp_path / "server.log") as url:
            graph_file = load_graph_file(graph_path)
            client, served = await served_runs(url, "babyai", {s: graph_file.episode_input(s) for s in seeds}, recorder)
            assert_same_turns(episodes, served)
            for seed, episode in episodes.items():
                _, state, thread_id = served[seed]
                assert state["steps"] == len(episode.turns)
                assert state["episode_return"] == pytest.approx(episode.total_reward)
                assert [answer for _, answer in state["history"]] == answers[seed]
                # per-request threads: each thread's checkpoint holds its own episode
                saved = await client.threads.get_state(thread_id)
                assert saved["values"]["seed"] == seed and saved["values"]["done"]

            # streaming graph updates: node by node, the same answers
            nodes, streamed_answers = [], []
            async for part in client.runs.stream(
                None, "babyai", input=graph_file.episode_input(0), stream_mode="updates"
            ):
                if part.event == "updates":
                    ((node, update),) = part.data.items()
                    nodes.append(node)
                    if node == "policy":
                        streamed_answers.append(update["answer"])
    assert nodes[:4] == ["reset", "memory", "policy", "environment"]
    assert streamed_answers == answers[0]


def test_repo_langgraph_json_names_every_graph_file():
    """docs/serving.md promises every graph of graphs/ behind LangGraph's own tooling."""
    named = json.loads((ROOT / "langgraph.json").read_text())["graphs"]
    files = {p.stem for p in (ROOT / "graphs").glob("*.py") if not p.stem.startswith("_")}
    assert set(named) == files
    assert all(target == f"verlog.serve.langgraph_app:{name}" for name, target in named.items())


async def test_repo_langgraph_json_serves_the_graphs(engine, tiny_tokenizer, tmp_path):
    """`langgraph dev` with the project's langgraph.json: every graph loads; guess_number
    (which trims its history) gives training's turns under seeded sampling."""
    graph_path = ROOT / "graphs" / "guess_number.py"
    seeds = [3, 4]
    episodes = await training_turns(engine, tiny_tokenizer, graph_path, seeds, {}, temperature=1.0, seed=7)
    answers = [[m.content for m in e.output["history"] if m.type == "ai"] for e in episodes.values()]
    assert len({a for run in answers for a in run}) > 5  # varied answers: a non-trivial comparison
    recorder = RecordingEngine(engine)
    server = OpenAIServer(recorder, tiny_tokenizer, model_name="tiny")
    port = free_port()
    with serve_in_thread(server) as base_url:
        cmd = [
            sys.executable,
            "-m",
            "langgraph_cli",
            "dev",
            "--config",
            str(ROOT / "langgraph.json"),
            "--port",
            str(port),
            "--no-browser",
            "--no-reload",
        ]
        env = {
            **os.environ,
            "VERLOG_BASE_URL": base_url,
            "VERLOG_MODEL": "tiny",
            "VERLOG_TEMPERATURE": "1",
            "VERLOG_SEED": "7",
            "VERLOG_GRAPHS_DIR": str(ROOT / "graphs"),
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        }
        with running(cmd, env, tmp_path, port, tmp_path / "server.log") as url:  # state stays in tmp_path
            graph_file = load_graph_file(graph_path)
            client, served = await served_runs(
                url, "guess_number", {s: graph_file.episode_input(s) for s in seeds}, recorder
            )
            assistants = await client.assistants.search(limit=50)
    assert {a["graph_id"] for a in assistants} >= set(json.loads((ROOT / "langgraph.json").read_text())["graphs"])
    assert_same_turns(episodes, served)
    for seed, episode in episodes.items():
        _, state, _ = served[seed]
        trained_answers = [m.content for m in episode.output["history"] if m.type == "ai"]
        assert [m["content"] for m in state["history"] if m["type"] == "ai"] == trained_answers
        assert state["guesses"] == episode.output["guesses"]


@pytest.mark.slow
async def test_verlog_serve_smollm2_greedy_guesses_match_training(tmp_path):
    """A real instruct model (SmolLM2-135M-Instruct): greedy guesses, served and trained, agree."""
    from verlog.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    engine = EmbeddedEngine(load_causal_lm("smollm2"), tokenizer, seed=0)
    try:
        graph_path = ROOT / "graphs" / "guess_number.py"
        graph_kwargs = {"max_guesses": 4, "max_tokens": 16}
        episodes = await training_turns(engine, tokenizer, graph_path, [0], graph_kwargs, temperature=0)
        recorder = RecordingEngine(engine)
        port = free_port()
        with serve_in_thread(OpenAIServer(recorder, tokenizer, model_name="smollm2")) as base_url:
            cmd = [
                sys.executable,
                "-m",
                "verlog.serve",
                "serve",
                str(graph_path),
                "--base-url",
                base_url,
                "--model",
                "smollm2",
                "--temperature",
                "0",
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path / "state"),
                "--graph-kwargs",
                json.dumps(graph_kwargs),
            ]
            with running(cmd, dict(os.environ), ROOT, port, tmp_path / "server.log") as url:
                graph_file = load_graph_file(graph_path)
                _, served = await served_runs(url, "guess_number", {0: graph_file.episode_input(0)}, recorder)
        assert_same_turns(episodes, served)
        guesses = [m.content for m in episodes[0].output["history"] if m.type == "ai"]
        assert any(ch.isdigit() for g in guesses for ch in g), guesses  # real answers, not noise
        assert [m["content"] for m in served[0][1]["history"] if m["type"] == "ai"] == guesses
    finally:
        engine.close()
