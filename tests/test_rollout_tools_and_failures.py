"""Tool calling end to end, and every way an episode can fail ending as a recorded failure.

The scripted engine plays the model (exact ids from the real tokenizer, fixed logprobs), so each
case is forced deterministically; the graph, chat model, recorder and runner are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from verlog.backends.base import SamplingParams
from verlog.backends.sglang import SGLangEngine
from verlog.backends.sglang_server import SGLangCompatServer
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.rewards import load_function
from verlog.rollout import areport_reward, run_episode
from verlog.testing.scripted_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = load_graph_file(ROOT / "graphs" / "calculator.py")


def tool_call(expression: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'calculate', 'arguments': {'expression': expression}})}\n</tool_call>"


def scripted_model(tokenizer, script) -> VerlogChatModel:
    return VerlogChatModel(engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer, max_tokens=200)


def calculator_row(index: int) -> dict:
    """Row ``index`` of the calculator's training split (data/calculator/train.jsonl)."""
    return json.loads((ROOT / "data" / "calculator" / "train.jsonl").read_text().splitlines()[index])


async def test_tool_call_round_trip(tiny_tokenizer):
    row = calculator_row(0)
    question = {"messages": [HumanMessage(row["prompt"])]}
    expression = row["prompt"].removeprefix("What is ").rstrip("?")
    target = float(row["answer"])
    model = scripted_model(tiny_tokenizer, [f"I will compute.\n{tool_call(expression)}", f"The answer is\n{target:g}"])
    episode = await run_episode(
        CALCULATOR.build(model), question, graph_config={"recursion_limit": 20}, keep_messages=True
    )
    assert episode.status == "ok", episode.error
    first, second = episode.turns
    # the model's tool call ran tools/calculator.py, and its result reached the next turn's prompt
    tool_message = second.messages[-1]
    assert tool_message.type == "tool" and tool_message.content == f"{target:g}"
    prompt_text = tiny_tokenizer.decode(second.prompt_ids)
    assert f"<tool_response>\n{target:g}\n</tool_response>" in prompt_text
    assert '"name": "calculate"' in prompt_text  # the assistant's call is rendered back
    # the tool schema was in the first prompt (chat template with tools)
    assert '"calculate"' in tiny_tokenizer.decode(first.prompt_ids)
    # the graph ended after the answer; the calculator's reward function (outside the graph) scores it
    assert second.terminated and first.messages[0].type == "system"
    correct = load_function(f"{ROOT / 'rewards' / 'calculator.py'}:correct")
    assert correct(completion=episode.output["messages"][-1].content, answer=row["answer"]) is True


async def test_bad_tool_call_json_is_shown_to_the_model(tiny_tokenizer):
    model = scripted_model(tiny_tokenizer, ['<tool_call>{"name": "calculate", "arguments": {</tool_call>', "42"])
    question = {"messages": [HumanMessage(calculator_row(1)["prompt"])]}
    episode = await run_episode(CALCULATOR.build(model), question, keep_messages=True)
    assert episode.status == "ok"
    first, second = episode.turns
    error_message = second.messages[-1]
    assert error_message.type == "tool" and "not valid JSON" in error_message.content
    assert second.terminated


async def test_graph_exception_is_a_failed_episode(tiny_tokenizer):
    model = scripted_model(tiny_tokenizer, ["fine"])

    async def policy(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def broken_env(state: MessagesState) -> dict:
        await areport_reward(1.0)
        raise RuntimeError("environment crashed")

    g = StateGraph(MessagesState)
    g.add_node("policy", policy)
    g.add_node("env", broken_env)
    g.add_edge(START, "policy")
    g.add_edge("policy", "env")
    g.add_edge("env", END)
    episode = await run_episode(g.compile(), {"messages": [HumanMessage("go")]})
    assert episode.status == "error" and "RuntimeError: environment crashed" in episode.error
    assert len(episode.turns) == 1 and episode.trainable_turns() == []


def looping_graph(model, own_time_s: float = 0.0):
    """A graph that never ends; each step spends ``own_time_s`` in its own code besides the model call."""

    async def policy(state: MessagesState) -> dict:
        await asyncio.sleep(own_time_s)
        return {"messages": [await model.ainvoke(state["messages"][-2:])]}

    g = StateGraph(MessagesState)
    g.add_node("policy", policy)
    g.add_edge(START, "policy")
    g.add_edge("policy", "policy")  # never ends
    return g.compile()


async def test_recursion_limit_is_a_failed_episode(tiny_tokenizer):
    model = scripted_model(tiny_tokenizer, ["again"])
    episode = await run_episode(
        looping_graph(model), {"messages": [HumanMessage("go")]}, graph_config={"recursion_limit": 5}
    )
    assert episode.status == "recursion_limit" and "recursion limit 5" in episode.error
    assert len(episode.turns) == 5 and episode.failed and episode.trainable_turns() == []


class SlowEngine(ScriptedEngine):
    """An engine on a busy machine: every call waits ``delay_s`` (a queue) before answering."""

    delay_s = 0.05

    async def generate(self, prompt_ids, sampling, *, request_id=None):
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_ids, sampling, request_id=request_id)


async def test_episode_timeout_is_a_failed_episode(tiny_tokenizer):
    """The graph's own code runs past timeout_s (0.05 s a step, 0.3 s allowed)."""
    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["again"]), tokenizer=tiny_tokenizer)
    episode = await run_episode(
        looping_graph(model, own_time_s=0.05),
        {"messages": [HumanMessage("go")]},
        graph_config={"recursion_limit": 1000},
        timeout_s=0.3,
    )
    assert episode.status == "timeout" and "its graph's own code ran 0.3 s" in episode.error
    assert 1 <= len(episode.turns) <= 7 and episode.trainable_turns() == []


async def test_a_slow_engine_never_times_an_episode_out(tiny_tokenizer):
    """Time queued on the engine is not the graph's: 12 calls of 0.1 s each against a 0.3 s timeout
    end the episode at its recursion limit, as on an idle machine, not in a timeout."""
    engine = SlowEngine(tiny_tokenizer, ["again"])
    engine.delay_s = 0.1
    model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer)
    started = time.perf_counter()
    episode = await run_episode(
        looping_graph(model),
        {"messages": [HumanMessage("go")]},
        graph_config={"recursion_limit": 12},
        timeout_s=0.3,
    )
    assert time.perf_counter() - started >= 12 * 0.1  # far past the timeout in wall time
    assert episode.status == "recursion_limit" and len(episode.turns) == 12


async def test_engine_timeout_over_http_is_a_failed_episode(tiny_tokenizer):
    """A real HTTP server that answers too slowly: the SGLang client times out after retries."""

    class StuckEngine(ScriptedEngine):
        async def generate(self, prompt_ids, sampling, *, request_id=None):
            await asyncio.sleep(5)
            return await super().generate(prompt_ids, sampling, request_id=request_id)

    async with SGLangCompatServer(StuckEngine(tiny_tokenizer, ["x"])) as server:
        client = SGLangEngine(server.url, timeout_s=0.2, max_retries=1, retry_backoff_s=0.01)
        model = VerlogChatModel(engine=client, tokenizer=tiny_tokenizer)
        episode = await run_episode(looping_graph(model), {"messages": [HumanMessage("go")]})
        await client.aclose()
        url = server.url
    assert episode.status == "error" and "EngineTimeoutError" in episode.error
    assert url in episode.error and "2 attempt" in episode.error
    assert episode.turns == [] and episode.trainable_turns() == []


async def test_episode_id_is_the_engine_request_id(tiny_tokenizer):
    seen: list[str | None] = []

    class Recording(ScriptedEngine):
        async def generate(self, prompt_ids, sampling: SamplingParams, *, request_id=None):
            seen.append(request_id)
            return await super().generate(prompt_ids, sampling, request_id=request_id)

    model = VerlogChatModel(engine=Recording(tiny_tokenizer, ["a"]), tokenizer=tiny_tokenizer)
    await run_episode(
        looping_graph(model), {"messages": [HumanMessage("go")]}, episode_id="ep-7", graph_config={"recursion_limit": 3}
    )
    assert seen == ["ep-7"] * 3


async def test_the_calculator_can_require_a_tool_call_first(tiny_model, tiny_tokenizer):
    """``require_tool``: the first answer to a question is a well-formed calculator call whatever the
    (random) model would say; what follows is free."""
    from verlog.backends.embedded import EmbeddedEngine

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    try:
        model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=48)
        graph = CALCULATOR.build(model, max_tool_rounds=1, require_tool=True)
        episode = await run_episode(
            graph, {"messages": [HumanMessage(calculator_row(2)["prompt"])]}, graph_config={"recursion_limit": 20}
        )
    finally:
        engine.close()
    assert episode.status == "ok", episode.error
    first = episode.output["messages"][1]
    assert first.response_metadata["sampling"]["constraint"]  # held to the tool's schema
    calls = first.tool_calls or first.invalid_tool_calls  # invalid only when max_tokens cut the call
    assert calls and calls[0]["name"] == "calculate"
    assert first.tool_calls or first.response_metadata["finish_reason"] == "length"
