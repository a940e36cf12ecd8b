"""``VerlogChatModel`` streams like any LangChain chat model: ``stream``/``astream`` give
``AIMessageChunk`` pieces that join into exactly the answer ``invoke`` gives, and a streamed
call inside a graph is recorded as a training turn token for token."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from tools.calculator import calculate
from verlog.backends.embedded import EmbeddedEngine
from verlog.llm import VerlogChatModel
from verlog.rollout import TurnRecorder, episode_config
from verlog.testing import ScriptedEngine

MESSAGES = [HumanMessage("hello there, how are you today?")]


def joined(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    out = chunks[0]
    for chunk in chunks[1:]:
        out = out + chunk
    return out


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    eng = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield eng
    eng.close()


async def test_pieces_join_into_the_invoked_answer(engine, tiny_tokenizer):
    model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=0, max_tokens=40)
    whole = await model.ainvoke(MESSAGES)
    pieces = [c async for c in model.astream(MESSAGES)]
    assert len(pieces) > 2 and all(isinstance(p, AIMessageChunk) for p in pieces)
    streamed = joined(pieces)
    assert streamed.content == whole.content
    for key in ("prompt_ids", "response_ids", "finish_reason", "sampling"):
        assert streamed.response_metadata[key] == whole.response_metadata[key], key
    # the same tokens; their logprobs may differ in the last float digits (other batch shapes)
    assert streamed.response_metadata["logprobs"] == pytest.approx(whole.response_metadata["logprobs"], abs=1e-4)
    assert streamed.usage_metadata["output_tokens"] == len(whole.response_metadata["response_ids"])
    # the sync API too (run from a worker thread, as a sync program would)
    sync_pieces = await asyncio.to_thread(lambda: list(model.stream(MESSAGES)))
    assert len(sync_pieces) > 2 and joined(sync_pieces).content == whole.content


async def test_stop_strings_never_reach_the_stream(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["one two three STOP four five"])
    model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, stop=["STOP"])
    whole = await model.ainvoke(MESSAGES)
    streamed = joined([c async for c in model.astream(MESSAGES)])
    assert "STOP" not in streamed.content and streamed.content == whole.content


async def test_tool_calls_come_whole_in_the_last_chunk(tiny_tokenizer):
    answer = 'Let me see.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>'
    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, [answer]), tokenizer=tiny_tokenizer)
    bound = model.bind_tools([calculate])
    whole = await bound.ainvoke(MESSAGES)
    streamed = joined([c async for c in bound.astream(MESSAGES)])
    assert streamed.content == whole.content == "Let me see."
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [("calculate", {"expression": "2+2"})]
    assert [c["id"] for c in streamed.tool_calls] == [c["id"] for c in whole.tool_calls] or len(
        streamed.tool_calls
    ) == 1


async def test_a_streamed_call_in_a_graph_is_recorded_exactly(engine, tiny_tokenizer):
    model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=0, max_tokens=24)

    async def chat(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("chat", chat)
    graph.add_edge(START, "chat")
    graph.add_edge("chat", END)
    app = graph.compile()
    recorder = TurnRecorder("streamed")
    pieces = []
    async for message, _meta in app.astream(
        {"messages": MESSAGES}, episode_config({}, "streamed", recorder), stream_mode="messages"
    ):
        pieces.append(message)
    assert len(pieces) > 1  # tokens arrived as the model produced them
    [turn] = recorder.episode().turns
    whole = await model.ainvoke(MESSAGES)
    assert turn.response_ids == whole.response_metadata["response_ids"]
    assert turn.prompt_ids == whole.response_metadata["prompt_ids"]
    assert turn.logprobs == pytest.approx(whole.response_metadata["logprobs"])
