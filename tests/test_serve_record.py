"""`serve-model --record`: every completion in the trace store token-exact, feedback over HTTP,
and the served model swapped in place without dropping requests.

A real HTTP server on the embedded engine with the tiny model, driven by the official OpenAI
client; what the store holds is compared with what the client received, and its logprobs with a
teacher-forced pass of the version that answered.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import aiohttp
import pytest
import torch

from verlog.backends.embedded import EmbeddedEngine
from verlog.serve import OpenAIServer
from verlog.testing.teacher_forced import teacher_forced_logprobs
from verlog.traces import EPISODE_HEADER, VERSION_HEADER, RecordingPolicy, TraceRecorder, open_store

openai = pytest.importorskip("openai")


def _client(server: OpenAIServer, key: str = "k") -> "openai.AsyncOpenAI":
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


async def test_completions_are_recorded_token_exact_and_feedback_attaches(tiny_model, tiny_tokenizer, recorder):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    messages = [{"role": "user", "content": "Name a colour."}]
    async with OpenAIServer(
        engine, tiny_tokenizer, model_name="tiny", api_key="k", recorder=recorder, model_version="v0"
    ) as server:
        oai = _client(server)
        raw = await oai.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0.8, seed=1, logprobs=True, user="episode-1"
        )
        assert raw.headers[EPISODE_HEADER] == "episode-1" and raw.headers[VERSION_HEADER] == "v0"
        first = raw.parse()
        stream = await oai.chat.completions.create(  # the header names the episode too, and wins
            model="tiny",
            messages=messages,
            max_tokens=12,
            temperature=0.8,
            seed=2,
            logprobs=True,
            stream=True,
            extra_headers={EPISODE_HEADER: "episode-1"},
            user="ignored",
        )
        chunks = [c async for c in stream]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        streamed_lps = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        anonymous = await oai.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=4)
        alone = anonymous.headers[EPISODE_HEADER]  # a completion of its own episode

        async with aiohttp.ClientSession() as session:
            url, auth = f"{server.base_url}/feedback", {"Authorization": "Bearer k"}
            async with session.post(url, json={"episode_id": "episode-1", "reward": 1}) as r:
                assert r.status == 401
            async with session.post(
                url,
                json={"episode_id": "episode-1", "reward": 1, "success": True, "info": {"source": "thumbs"}},
                headers=auth,
            ) as r:
                assert r.status == 200, await r.text()
            async with session.post(
                url, json={"episode_id": "episode-1", "turn": 0, "reward": -0.5}, headers=auth
            ) as r:
                assert r.status == 200
            async with session.post(url, json={"episode_id": "nobody", "reward": 1}, headers=auth) as r:
                assert r.status == 404 and (await r.json())["error"]["param"] == "episode_id"
            async with session.post(url, json={"episode_id": "episode-1", "reward": "good"}, headers=auth) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "reward"
            async with session.post(url, json={"episode_id": "episode-1", "stars": 5}, headers=auth) as r:
                assert r.status == 400 and "stars" in (await r.json())["error"]["message"]
    engine.close()

    store = recorder.store
    turns = store.turns("episode-1")
    assert [t.turn_index for t in turns] == [0, 1] and len(store.turns(alone)) == 1
    for turn, text, entries in (
        (turns[0], first.choices[0].message.content, first.choices[0].logprobs.content),
        (turns[1], streamed, streamed_lps),
    ):
        assert turn.model_version == "v0" and (turn.temperature, turn.top_p) == (0.8, 1.0)
        assert turn.response_text == text and turn.messages == messages
        # byte-equal to what the client received, token by token, and the same logprobs
        assert [e.logprob for e in entries] == turn.logprobs and len(entries) == len(turn.response_ids)
        assert b"".join(bytes(e.bytes) for e in entries) == text.encode()
        assert turn.logprobs == pytest.approx(
            teacher_forced_logprobs(tiny_model, turn.prompt_ids, turn.response_ids, turn.temperature), abs=1e-4
        )
        assert turn.latency_s > 0 and turn.info["max_tokens"] == 12
    record = store.episode("episode-1")
    assert (record.reward, record.success, record.info) == (1.0, True, {"source": "thumbs"})
    assert [t.reward for t in turns] == [-0.5, 0.0]  # the turn feedback, on its turn
    assert [t.info["seed"] for t in turns] == [1, 2]


async def test_ids_only_and_a_server_that_does_not_record(tiny_model, tiny_tokenizer, tmp_path):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    store = open_store(tmp_path / "private", RecordingPolicy(privacy="ids_only"))
    recorder = TraceRecorder(store)
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder) as server:
        await _client(server).chat.completions.create(
            model="tiny", user="p", max_tokens=4, messages=[{"role": "user", "content": "secret"}]
        )
    recorder.flush()
    (turn,) = store.turns("p")
    assert turn.response_text is None and turn.messages is None and turn.prompt_ids and turn.model_version == "tiny"
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        raw = await _client(server).chat.completions.with_raw_response.create(
            model="tiny", user="p", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        assert EPISODE_HEADER not in raw.headers and raw.headers[VERSION_HEADER] == "tiny"
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server.base_url}/feedback", json={"episode_id": "p", "reward": 1}) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "endpoint_closed"  # no key: closed
            async with session.post(f"{server.base_url}/admin/reload") as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "endpoint_closed"
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", admin_key="admin") as server:
        async with aiohttp.ClientSession() as session:
            admin = {"Authorization": "Bearer admin"}
            async with session.post(
                f"{server.base_url}/feedback", json={"episode_id": "p", "reward": 1}, headers=admin
            ) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_recording"
            async with session.post(f"{server.base_url}/admin/reload", headers=admin) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_reloadable"
    recorder.close()
    store.close()
    engine.close()


async def test_swap_in_place_finishes_requests_in_flight_on_the_old_weights(tiny_model, tiny_tokenizer, recorder):
    new_model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    old_engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    new_engine = EmbeddedEngine(new_model, tiny_tokenizer, seed=0)
    reloads = []

    def reloader():
        reloads.append(1)
        return (new_engine, tiny_tokenizer, "v1") if len(reloads) == 1 else (None, tiny_tokenizer, "v1")

    messages = [{"role": "user", "content": "Tell me a long story."}]
    async with OpenAIServer(
        old_engine,
        tiny_tokenizer,
        model_name="tiny",
        recorder=recorder,
        model_version="v0",
        reloader=reloader,
        admin_key="admin",
    ) as server:
        oai = _client(server)
        stream = await oai.chat.completions.create(
            model="tiny", messages=messages, max_tokens=200, temperature=1.0, seed=3, stream=True, user="in-flight"
        )
        chunks = [await stream.__anext__(), await stream.__anext__()]  # generating on v0
        async with aiohttp.ClientSession() as session:
            admin = {"Authorization": "Bearer admin"}
            async with session.post(f"{server.base_url}/admin/reload", headers=admin) as r:
                swapped = await r.json()
            async with session.post(f"{server.base_url}/admin/reload", headers=admin) as r:  # nothing newer: no swap
                again = await r.json()
        assert swapped == {"object": "reload", "version": "v1", "previous": "v0", "swapped": True}
        assert again["swapped"] is False and server.model_version == "v1"
        after = await oai.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=8, temperature=1.0, seed=4, user="after"
        )
        assert after.headers[VERSION_HEADER] == "v1"
        chunks += [c async for c in stream]  # the request in flight finishes, on v0
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        for _ in range(50):
            if old_engine._closed:
                break
            await asyncio.sleep(0.05)
        assert old_engine._closed and not new_engine._closed  # the old engine is closed once idle
    new_engine.close()
    recorder.flush()
    (flight,), (later,) = recorder.store.turns("in-flight"), recorder.store.turns("after")
    assert (flight.model_version, later.model_version) == ("v0", "v1")
    assert len(flight.response_ids) > 2
    for turn, model in ((flight, tiny_model), (later, new_model)):
        recomputed = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids, 1.0)
        assert turn.logprobs == pytest.approx(recomputed, abs=1e-4)
    other = teacher_forced_logprobs(new_model, flight.prompt_ids, flight.response_ids, 1.0)
    assert flight.logprobs != pytest.approx(other, abs=1e-3)


async def test_swap_refuses_another_tokenizer(tiny_model, tiny_tokenizer):
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = "{{ messages }}"
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    async with OpenAIServer(
        engine, tiny_tokenizer, model_name="tiny", reloader=lambda: (engine, other, "v9")
    ) as server:
        with pytest.raises(ValueError, match="another tokenizer"):
            await server.swap(engine, "v9", tokenizer=other)
        assert server.model_version == "tiny"
    engine.close()


def test_serve_model_record_flags_fail_in_one_line(capsys, tmp_path):
    from verlog.serve.commands import main

    assert main(["serve-model", "tiny", "--record", "postgresql://u:pw@127.0.0.1:1/x?connect_timeout=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot connect to the trace store postgresql://u:***@127.0.0.1:1" in err[0]
    assert "pw" not in err[0]
    assert main(["serve-model", "tiny", "--record", str(tmp_path / "t"), "--record-max-mb", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --record-max-mb must be >= 0 (0: no bound), got -1.0"


async def test_a_served_graph_files_each_thread_as_an_episode(tiny_model, tiny_tokenizer, recorder, monkeypatch):
    """`verlog serve`'s ChatOpenAI names the LangGraph thread as the episode of its calls."""
    from langgraph.checkpoint.memory import InMemorySaver

    from verlog.graph_file import load_graph_file

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder) as server:
        for name, value in (
            ("VERLOG_BASE_URL", server.base_url),
            ("VERLOG_MODEL", "tiny"),
            ("VERLOG_GRAPHS_DIR", str(Path(__file__).parent / "graphs")),
        ):
            monkeypatch.setenv(name, value)  # the module builds its graphs when imported
        from verlog.serve.langgraph_app import chat_model_from_env

        model = chat_model_from_env({"VERLOG_BASE_URL": server.base_url, "VERLOG_MODEL": "tiny"})
        graph_file = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / "cue_corridor.py")
        graph = graph_file.build(model, length=4, max_turns=3)
        graph.checkpointer = InMemorySaver()
        await graph.ainvoke(graph_file.episode_input(5), {"configurable": {"thread_id": "thread-7"}})
    engine.close()
    recorder.flush()
    assert [t.turn_index for t in recorder.store.turns("thread-7")] == [0, 1, 2]


async def test_a_tool_agents_turns_land_in_one_episode_through_bind_tools_and_a_sub_graph(tiny_tokenizer, recorder):
    """``episode_chat_openai``: the run's ``configurable.episode_id`` names the episode of every call,
    through LangGraph's prebuilt agent (``bind_tools``) run as a sub-graph of the service's graph."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from verlog.graph_file import load_graph_file
    from verlog.testing.scripted_engine import ScriptedEngine
    from verlog.traces import episode_chat_openai

    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
    engine = ScriptedEngine(tiny_tokenizer, [call, "5"])
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder) as server:
        model = episode_chat_openai(base_url=server.base_url, model="tiny", api_key="k", max_retries=0)
        agent = load_graph_file(Path(__file__).parent / "graphs" / "prebuilt_react_agent.py").build(model)
        service = StateGraph(MessagesState)
        service.add_node("agent", agent)  # the agent as a sub-graph of the service's own graph
        service.add_edge(START, "agent")
        service.add_edge("agent", END)
        app = service.compile()
        for session in ("session-1", "session-2"):
            final = await app.ainvoke(
                {"messages": [HumanMessage("What is 2+3?")]}, {"configurable": {"episode_id": session}}
            )
            assert final["messages"][-1].content == "5" and any(m.type == "tool" for m in final["messages"])
        # without an episode_id the LangGraph thread names it, as under `verlog serve`
        await app.ainvoke({"messages": [HumanMessage("What is 2+3?")]}, {"configurable": {"thread_id": "thread-9"}})
    for episode in ("session-1", "session-2", "thread-9"):
        turns = recorder.store.turns(episode)
        assert [t.turn_index for t in turns] == [0, 1], episode  # the tool call and the answer, one episode
        assert "calculate" in turns[0].response_text and turns[1].response_text == "5"
    assert len(recorder.store.episodes()) == 3


async def test_structured_output_calls_name_the_runs_episode(tiny_model, tiny_tokenizer, recorder):
    """``with_structured_output`` (a JSON schema the engine holds the answer to) in a graph node: the
    call files under the run's ``configurable.episode_id`` like plain calls."""
    from langgraph.graph import END, START, StateGraph
    from pydantic import BaseModel
    from typing_extensions import TypedDict

    from verlog.traces import episode_chat_openai

    class Verdict(BaseModel):
        ok: bool

    class State(TypedDict, total=False):  # (annotations resolvable from the module: no local names)
        verdict: object
        text: str

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder) as server:
        model = episode_chat_openai(base_url=server.base_url, model="tiny", api_key="k", max_retries=0, max_tokens=16)
        judge = model.with_structured_output(Verdict, method="json_schema")

        async def chat(state: State) -> State:
            return {"text": (await model.ainvoke("Say yes.")).content}

        async def decide(state: State) -> State:
            return {"verdict": await judge.ainvoke(f"Was this a yes? {state['text']}")}

        graph = StateGraph(State)
        graph.add_node("chat", chat)
        graph.add_node("decide", decide)
        graph.add_edge(START, "chat")
        graph.add_edge("chat", "decide")
        graph.add_edge("decide", END)
        final = await graph.compile().ainvoke({}, {"configurable": {"episode_id": "judged"}})
        assert isinstance(final["verdict"], Verdict)
    engine.close()
    turns = recorder.store.turns("judged")
    assert [t.turn_index for t in turns] == [0, 1] and turns[1].constraint == "json_schema"


def test_episode_model_answers_from_one_event_loop_after_another(tiny_tokenizer):
    """Two ``asyncio.run`` in one process against one endpoint (a script that evaluates twice, a
    notebook): the second is not handed the first loop's closed connections, for
    ``episode_chat_openai`` and for ``verlog eval --base-url``'s model alike."""
    from verlog.evaluation.players import EndpointModel
    from verlog.serve import serve_in_thread
    from verlog.testing.scripted_engine import ScriptedEngine
    from verlog.traces import episode_chat_openai

    engine = ScriptedEngine(tiny_tokenizer, ["one", "two", "three", "four"])
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        models = [
            episode_chat_openai(base_url=base_url, model="tiny", api_key="k", max_retries=0),
            EndpointModel(base_url, "tiny", api_key="k", max_retries=0)._client(),
        ]
        answers = [asyncio.run(model.ainvoke("hi")).content for model in models for _ in range(2)]
    assert answers == ["one", "two", "three", "four"]
