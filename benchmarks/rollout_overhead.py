"""P1: what verlog adds per turn over a plain LangGraph loop (TARGETS.md).

The same two-node loop (policy <-> environment, N turns per episode) runs three ways with a
zero-latency engine:

* plain:   LangChain's ``GenericFakeChatModel``, no recorder (LangGraph's own cost);
* verlog:  ``VerlogChatModel`` on a ``ScriptedEngine`` + ``TurnRecorder`` through ``run_episode``;
* bare:    a Python loop rendering the chat template and calling the engine (no LangGraph).

Prints ms per turn for each and the added cost (goal: verlog - plain <= 0.3 ms/turn).
Usage: python benchmarks/rollout_overhead.py [--turns 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.backends.base import SamplingParams
from verlog.testing.scripted_engine import ScriptedEngine
from verlog.llm import VerlogChatModel
from verlog.llm.prompt import PromptRenderer
from verlog.models import load_tokenizer
from verlog.rollout import areport_reward, run_episode

ANSWER = "I go forward.\nACTION: go forward"
OBSERVATION = "You see a red ball 2 steps forward and a wall 3 steps to the left."


class State(TypedDict):
    observation: str
    last_answer: str
    step: int


def build_loop(model, turns: int, report: bool):
    """policy (one model call) -> environment (one reward) -> policy ... for ``turns`` turns."""

    async def policy(state: State) -> dict:
        answer = await model.ainvoke([SystemMessage("Play the game."), HumanMessage(state["observation"])])
        return {"last_answer": answer.content}

    async def environment(state: State) -> dict:
        step = state["step"] + 1
        if report:
            await areport_reward(0.0, terminated=step >= turns)
        return {"step": step, "observation": f"{OBSERVATION} (step {step})"}

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    async def next_step(state: State) -> str:  # async: LangGraph runs sync routers in threads
        return END if state["step"] >= turns else "policy"

    g.add_conditional_edges("environment", next_step, ["policy", END])
    return g.compile()


def start(turns: int) -> dict:
    return {"observation": OBSERVATION, "last_answer": "", "step": 0}


async def time_plain(turns: int) -> float:
    fake = GenericFakeChatModel(messages=itertools.repeat(AIMessage(ANSWER)))
    graph = build_loop(fake, turns, report=False)
    t0 = time.perf_counter()
    await graph.ainvoke(start(turns), {"recursion_limit": 10 * turns})
    return (time.perf_counter() - t0) / turns


async def time_verlog(turns: int, tokenizer) -> float:
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, [ANSWER]), tokenizer=tokenizer)
    graph = build_loop(model, turns, report=True)
    t0 = time.perf_counter()
    episode = await run_episode(graph, start(turns), graph_config={"recursion_limit": 10 * turns})
    elapsed = time.perf_counter() - t0
    assert episode.status == "ok" and len(episode.turns) == turns, episode.error
    return elapsed / turns


async def time_bare(turns: int, tokenizer) -> float:
    engine = ScriptedEngine(tokenizer, [ANSWER])
    renderer = PromptRenderer(tokenizer)
    sampling = SamplingParams()
    t0 = time.perf_counter()
    observation = OBSERVATION
    for step in range(turns):
        ids = renderer.render([SystemMessage("Play the game."), HumanMessage(observation)])
        gen = await engine.generate(ids, sampling)
        tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        observation = f"{OBSERVATION} (step {step + 1})"
    return (time.perf_counter() - t0) / turns


async def main(turns: int, repeats: int) -> None:
    tokenizer = load_tokenizer("tiny")
    await time_verlog(10, tokenizer)  # warm-up: template compilation, imports
    await time_plain(10)
    results: dict[str, list[float]] = {"plain": [], "verlog": [], "bare": []}
    for _ in range(repeats):  # interleaved, so machine noise hits all three alike
        results["plain"].append(await time_plain(turns))
        results["verlog"].append(await time_verlog(turns, tokenizer))
        results["bare"].append(await time_bare(turns, tokenizer))
    med = {k: statistics.median(v) * 1000 for k, v in results.items()}
    print(f"turns per episode: {turns}, repeats: {repeats} (median ms per turn)")
    print(f"  plain LangGraph + GenericFakeChatModel : {med['plain']:.3f} ms/turn")
    print(f"  verlog chat model + recorder           : {med['verlog']:.3f} ms/turn")
    print(f"  bare loop (template + engine call)     : {med['bare']:.3f} ms/turn")
    added = med["verlog"] - med["plain"]
    print(f"added by verlog over plain LangGraph     : {added:.3f} ms/turn (target <= 0.3) "
          f"{'OK' if added <= 0.3 else 'MISSED'}")
    print(f"ratio verlog / plain                     : {med['verlog'] / med['plain']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.repeats))
