"""P1: what verlog adds per turn over a plain LangGraph loop, for async and sync nodes alike.

The same two-node loop (policy <-> environment, N turns per episode) runs with a zero-latency
engine, in two node styles: ``async def`` nodes (``ainvoke``, ``graph.ainvoke``) and ``def``
nodes (``invoke``, ``graph.invoke``, the shape of most LangGraph examples), each two ways:

* plain:   LangChain's ``GenericFakeChatModel``, no recorder (LangGraph's own cost);
* verlog:  ``VerlogChatModel`` on a ``ScriptedEngine`` + ``TurnRecorder`` in the run's callbacks;

and, for scale, a bare Python loop rendering the chat template and calling the engine; the sync
loop once more with every prompt's ids rendered beforehand (handed to the chat model ready-made:
what the template and the tokenizer cost inside LangGraph's flow, where their caches are cold,
against the bare loop where they are warm); and the training path: the same loop as one env slot
of a ``SlotRunner`` collecting a batch of N turns (every call through the batch gate on the
runner's loop; the graph there too, ``rollout.slot_threads: auto``, and on the slot's own loop and
thread, ``always``).

Every observation is new (a counter in its text), so no cache of earlier prompts answers the newest
message. A last section times the prompt ids of long histories (11, 51, 201 messages), where the
pieces of earlier messages are remembered (``verlog.tokens.encode_plain``), against the template
plus the tokenizer's own call on the whole prompt.

Prints ms per turn for each and the added cost per style (goal: verlog - plain <= 0.3 ms/turn;
plain LangGraph itself costs about 1 ms a turn on a 2-core machine).
Usage: python benchmarks/rollout_overhead.py [--turns 200] [--repeats 9]
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
from verlog.llm import VerlogChatModel
from verlog.llm.prompt import PromptRenderer
from verlog.models import load_tokenizer
from verlog.rollout import TurnRecorder, areport_reward, episode_config, report_reward, run_episode
from verlog.rollout.slots import SlotRunner
from verlog.testing.scripted_engine import ScriptedEngine

ANSWER = "I go forward.\nACTION: go forward"
OBSERVATION = "You see a red ball 2 steps forward and a wall 3 steps to the left."
#: every observation of the run is new (a game's are), so no cache of earlier prompts can answer
#: the newest message for free; what repeats is what repeats in a game: the system prompt and
#: the template's role headers
_MOVES = itertools.count()


def observation() -> str:
    return f"{OBSERVATION} (move {next(_MOVES)})"


class State(TypedDict):
    observation: str
    last_answer: str
    step: int


def build_loop(model, turns: int, report: bool, sync: bool = False):
    """policy (one model call) -> environment (one reward) -> policy ... for ``turns`` turns;
    ``sync``: ``def`` nodes and router (run with ``graph.invoke``)."""

    def prompt(state: State) -> list:
        return [SystemMessage("Play the game."), HumanMessage(state["observation"])]

    def advance(state: State) -> dict:
        step = state["step"] + 1
        return {"step": step, "observation": observation()}

    async def policy(state: State) -> dict:
        return {"last_answer": (await model.ainvoke(prompt(state))).content}

    async def environment(state: State) -> dict:
        if report:
            await areport_reward(0.0, terminated=state["step"] + 1 >= turns)
        return advance(state)

    async def next_step(state: State) -> str:  # async: LangGraph runs sync routers in threads
        return END if state["step"] >= turns else "policy"

    def sync_policy(state: State) -> dict:
        return {"last_answer": model.invoke(prompt(state)).content}

    def sync_environment(state: State) -> dict:
        if report:
            report_reward(0.0, terminated=state["step"] + 1 >= turns)
        return advance(state)

    def sync_next_step(state: State) -> str:
        return END if state["step"] >= turns else "policy"

    g = StateGraph(State)
    g.add_node("policy", sync_policy if sync else policy)
    g.add_node("environment", sync_environment if sync else environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", sync_next_step if sync else next_step, ["policy", END])
    return g.compile()


def start(turns: int) -> dict:
    return {"observation": observation(), "last_answer": "", "step": 0}


async def time_plain(turns: int, sync: bool = False) -> float:
    """Plain LangGraph under ``graph.ainvoke`` (as training and evaluation run graphs); ``sync``:
    ``def`` nodes, which LangGraph runs in its loop's thread pool."""
    fake = GenericFakeChatModel(messages=itertools.repeat(AIMessage(ANSWER)))
    graph = build_loop(fake, turns, report=False, sync=sync)
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


def time_plain_sync(turns: int) -> float:
    fake = GenericFakeChatModel(messages=itertools.repeat(AIMessage(ANSWER)))
    graph = build_loop(fake, turns, report=False, sync=True)
    t0 = time.perf_counter()
    graph.invoke(start(turns), {"recursion_limit": 10 * turns})
    return (time.perf_counter() - t0) / turns


class _Prerendered(PromptRenderer):
    """Hands back prompt ids rendered beforehand, one prompt after another: ids of prompts of the
    same shape as the loop's (the system message and a new observation each), so only where the
    rendering happens changes."""

    def __init__(self, tokenizer, turns: int):
        super().__init__(tokenizer)
        self._prompts = iter(
            [self.render([SystemMessage("Play the game."), HumanMessage(observation())]) for _ in range(turns)]
        )

    def render_images(self, messages, tools=None):
        return next(self._prompts), None


def time_verlog_sync(turns: int, tokenizer, prerendered: bool = False) -> float:
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, [ANSWER]), tokenizer=tokenizer)
    if prerendered:
        model._renderer = _Prerendered(tokenizer, turns)
    graph = build_loop(model, turns, report=True, sync=True)
    recorder = TurnRecorder("sync")
    t0 = time.perf_counter()
    graph.invoke(start(turns), episode_config({"recursion_limit": 10 * turns}, "sync", recorder))
    elapsed = time.perf_counter() - t0
    episode = recorder.episode("ok")
    assert len(episode.turns) == turns and episode.turns[-1].terminated
    return elapsed / turns


async def time_slots(turns: int, tokenizer, sync: bool = False, slot_threads: str = "auto") -> float:
    """One env slot collecting a batch of ``turns`` turns (the training path): by default on the
    runner's own loop, with ``slot_threads="always"`` on a loop and thread of the slot's own."""
    runner = SlotRunner(
        ScriptedEngine(tokenizer, [ANSWER]),
        lambda gated: build_loop(VerlogChatModel(engine=gated, tokenizer=tokenizer), turns, report=True, sync=sync),
        start,
        num_envs=1,
        turns_per_env=turns,
        graph_config={"recursion_limit": 10 * turns},
        slot_threads=slot_threads,
    )
    try:
        t0 = time.perf_counter()
        batch = await runner.collect()
        elapsed = time.perf_counter() - t0
    finally:
        await runner.aclose()
    assert len(batch.turns[0]) == turns and batch.turns[0][-1].terminated
    return elapsed / turns


async def time_bare(turns: int, tokenizer) -> float:
    engine = ScriptedEngine(tokenizer, [ANSWER])
    renderer = PromptRenderer(tokenizer)
    sampling = SamplingParams()
    t0 = time.perf_counter()
    seen = observation()
    for _ in range(turns):
        ids = renderer.render([SystemMessage("Play the game."), HumanMessage(seen)])
        gen = await engine.generate(ids, sampling)
        tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        seen = observation()
    return (time.perf_counter() - t0) / turns


def time_history(tokenizer, messages: int, turns: int = 100) -> tuple[float, float]:
    """A prompt of ``messages`` messages (a game's history, a new observation last): ms per turn
    for its ids through verlog's renderer, and through the template plus the tokenizer's own
    call (every turn encodes its whole history again)."""
    renderer = PromptRenderer(tokenizer)
    history: list = [SystemMessage("Play the game.")]
    while len(history) < messages - 1:
        history += [HumanMessage(observation()), AIMessage(ANSWER)]
    prompts = [history + [HumanMessage(observation())] for _ in range(turns)]
    t0 = time.perf_counter()
    for prompt in prompts:
        renderer.render(prompt)
    ours = (time.perf_counter() - t0) / turns
    prompts = [history + [HumanMessage(observation())] for _ in range(turns)]
    t0 = time.perf_counter()
    for prompt in prompts:
        tokenizer(renderer.render_text(prompt), add_special_tokens=False, verbose=False)
    whole = (time.perf_counter() - t0) / turns
    return ours * 1000, whole * 1000


async def main(turns: int, repeats: int) -> None:
    tokenizer = load_tokenizer("tiny")
    # warm-up: template compilation, imports, the sync bridge's thread
    await time_verlog(10, tokenizer)
    await time_plain(10)
    await asyncio.to_thread(time_verlog_sync, 10, tokenizer)
    await asyncio.to_thread(time_plain_sync, 10)
    await time_slots(10, tokenizer)
    await time_plain(10, sync=True)
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "plain",
            "verlog",
            "plain_sync",
            "verlog_sync",
            "prerendered_sync",
            "bare",
            "slots",
            "slots_sync",
            "slots_threads",
            "slots_sync_threads",
            "plain_sync_async",
        )
    }
    for _ in range(repeats):  # interleaved, so machine noise hits all of them alike
        results["plain"].append(await time_plain(turns))
        results["verlog"].append(await time_verlog(turns, tokenizer))
        # a sync graph is run from sync code (no running loop), as a user's script would
        results["plain_sync"].append(await asyncio.to_thread(time_plain_sync, turns))
        results["verlog_sync"].append(await asyncio.to_thread(time_verlog_sync, turns, tokenizer))
        results["prerendered_sync"].append(await asyncio.to_thread(time_verlog_sync, turns, tokenizer, True))
        results["bare"].append(await time_bare(turns, tokenizer))
        results["slots"].append(await time_slots(turns, tokenizer))
        results["slots_sync"].append(await time_slots(turns, tokenizer, sync=True))
        results["plain_sync_async"].append(await time_plain(turns, sync=True))
        results["slots_threads"].append(await time_slots(turns, tokenizer, slot_threads="always"))
        results["slots_sync_threads"].append(await time_slots(turns, tokenizer, sync=True, slot_threads="always"))
    med = {k: statistics.median(v) * 1000 for k, v in results.items()}
    print(f"turns per episode: {turns}, repeats: {repeats} (median ms per turn)")
    for style, plain, ours in (("async nodes", "plain", "verlog"), ("sync nodes", "plain_sync", "verlog_sync")):
        added = med[ours] - med[plain]
        print(f"{style}:")
        print(f"  plain LangGraph + GenericFakeChatModel : {med[plain]:.3f} ms/turn")
        print(f"  verlog chat model + recorder           : {med[ours]:.3f} ms/turn")
        print(
            f"  added by verlog                        : {added:.3f} ms/turn (target <= 0.3) "
            f"{'OK' if added <= 0.3 else 'MISSED'}; ratio {med[ours] / med[plain]:.2f}x"
        )
    print(f"bare loop (template + engine call)       : {med['bare']:.3f} ms/turn")
    prompt = med["verlog_sync"] - med["prerendered_sync"]
    print(
        f"sync nodes, prompt ids rendered beforehand : {med['prerendered_sync']:.3f} ms/turn: the exact prompt "
        f"(template + tokens) costs {prompt:.3f} ms/turn inside the loop ({prompt / max(med['verlog_sync'] - med['plain_sync'], 1e-9):.0%} of verlog's added cost)"
    )
    print("training path (one env slot, calls through the batch gate; goal: <= 1.0 ms over plain LangGraph):")
    for style, plain, ours in (
        ("async nodes", "plain", "slots"),
        ("sync nodes", "plain_sync", "slots_sync"),
        ("async nodes, slot threads", "plain", "slots_threads"),
        ("sync nodes, slot threads", "plain_sync", "slots_sync_threads"),
    ):
        print(f"  {style:<25}: {med[ours]:.3f} ms/turn, {med[ours] - med[plain]:+.3f} over plain LangGraph")
    print(
        f"  plain LangGraph, def nodes under graph.ainvoke (its thread pool's hops): {med['plain_sync_async']:.3f} ms/turn; "
        f"sync nodes' training path {med['slots_sync'] - med['plain_sync_async']:+.3f} over it"
    )
    print("prompt ids of a long history (template + encoding; earlier messages' pieces remembered):")
    for messages in (11, 51, 201):
        ours, whole = time_history(tokenizer, messages)
        print(
            f"  {messages:>3} messages: {ours:.3f} ms/turn; encoding it whole each turn: {whole:.3f} ms ({whole / ours:.1f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.repeats))
