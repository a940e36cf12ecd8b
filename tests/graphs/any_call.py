"""A game played through every way LangChain lets a node call a model, in parallel where it can.

Step ``t`` of episode ``seed`` makes ``calls_at(seed, t)`` model calls (1 to 3) in one style,
each after a random delay of at most ``max_delay`` seconds, then the ``environment`` node pays
``t + 1`` (the episode ends after ``2 + seed % 4`` steps). The style of step ``t`` is
``styles[(seed + t) % len(styles)]``:

========================  ===================================================================
``ainvoke`` / ``invoke``  one call after another (``async def`` / ``def`` node)
``gather``                ``asyncio.gather`` of ``ainvoke`` calls in one node
``send`` / ``send_sync``  a ``Send`` fan-out: one branch per call
``abatch`` / ``batch``    one ``abatch`` / ``batch`` of the calls
``astream`` / ``stream``  each call streamed, chunks joined
``late`` / ``late_sync``  two parallel branches; the second waits ``late_s`` before calling
``own_callbacks[_sync]``  calls made with ``config={"callbacks": [...]}`` (their own handlers)
``astructured`` /         ``with_structured_output`` (a forced tool call)
``structured``
``invoke_in_async``       ``model.invoke`` inside an ``async def`` node (blocks its event loop)
``stream_in_async``       ``model.stream`` inside an ``async def`` node (blocks its event loop)
``batch_in_async``        ``model.batch`` inside an ``async def`` node (blocks its event loop)
========================  ===================================================================

With ``judge=True`` a ``judge`` node reuses the policy model, kept out of training with
``model.with_config(tags=[NO_TRAIN_TAG])``, and its score (``judge_score`` of its answer) is the
step's reward; the environment then pays nothing. With ``checkpointer=True`` the graph is compiled
with a ``MemorySaver`` shared by every graph this module builds. Prompts name the seed, the step
and the call (``seed S step T call I``), so a prompt says which call it was.
"""

from __future__ import annotations

import asyncio
import operator
import random
import time
from typing import Annotated, Any, Awaitable, Callable

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import MemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from verlog.rollout import NO_TRAIN_TAG, areport_reward

PARALLEL = ("gather", "send", "send_sync", "abatch", "batch", "late", "late_sync")
#: styles whose sync calls block the event loop of an ``async def`` node (as production graphs may)
BLOCKING = ("invoke_in_async", "stream_in_async", "batch_in_async")
SEQUENTIAL = (
    "ainvoke",
    "invoke",
    "astream",
    "stream",
    "own_callbacks",
    "own_callbacks_sync",
    "astructured",
    "structured",
) + BLOCKING
#: every style
STYLES = PARALLEL + SEQUENTIAL

#: one checkpointer for every graph of this module: threads persist across runs
SAVER = MemorySaver()


class State(TypedDict):
    seed: int
    t: int
    done: bool
    answers: Annotated[list[str], operator.add]


class Choice(BaseModel):
    """The structured styles' answer."""

    answer: str = Field(max_length=6)


class CountCalls(BaseCallbackHandler):
    """A handler of the graph's own: calls made with it replace the run's callbacks."""

    def __init__(self) -> None:
        self.ended = 0

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.ended += 1


def episode_length(seed: int) -> int:
    return 2 + seed % 4


def calls_at(seed: int, t: int) -> int:
    return 1 + (7 * seed + 3 * t) % 3


def prompt(seed: int, t: int, i: int) -> list:
    return [HumanMessage(f"seed {seed} step {t} call {i}")]


def judge_prompt(seed: int, t: int, answer: str) -> list:
    return [HumanMessage(f"judge seed {seed} step {t}: is {answer!r} right?")]


def judge_score(verdict: str) -> float:
    """The judge's score of an answer, read from the judge's own answer."""
    return float(len(verdict) % 5)


def make_input(seed: int) -> dict:
    return {"seed": seed, "t": 0, "done": False, "answers": []}


def build_graph(
    model,
    styles: Any = STYLES,
    max_delay: float = 0.0,
    late_s: float = 0.05,
    judge: bool = False,
    checkpointer: bool = False,
    max_tokens: int = 16,
) -> Any:
    styles = [styles] if isinstance(styles, str) else list(styles)
    unknown = set(styles) - set(STYLES)
    if unknown:
        raise ValueError(f"unknown styles {sorted(unknown)}; known: {list(STYLES)}")
    policy = model.bind(max_tokens=max_tokens)
    # a budget no answer can run out of (6 characters, each at worst a \\uXXXX escape, and the call's
    # JSON around them): set on a copy of the model, since ``with_structured_output`` keeps no ``bind``
    # arguments (LangChain's RunnableBinding forwards the method to the bare model)
    structured = model.model_copy(update={"max_tokens": 64}).with_structured_output(Choice)
    judge_model = model.bind(max_tokens=max_tokens).with_config(tags=[NO_TRAIN_TAG])
    handler = CountCalls()

    def pause(seed: int, t: int, i: int) -> float:
        return random.Random(f"{seed}/{t}/{i}").random() * max_delay

    def text(answer: Any) -> str:
        return (
            answer if isinstance(answer, str) else answer.answer if isinstance(answer, Choice) else str(answer.content)
        )

    # ------------------------------------------------------------------ one node per style
    def one_by_one(call: Callable[[list], Awaitable[Any]]) -> Callable[[State], Awaitable[dict]]:
        """An ``async def`` node making the step's calls one after another with ``call``."""

        async def node(s: State) -> dict:
            out = []
            for i in range(calls_at(s["seed"], s["t"])):
                await asyncio.sleep(pause(s["seed"], s["t"], i))
                out.append(text(await call(prompt(s["seed"], s["t"], i))))
            return {"answers": out}

        return node

    def one_by_one_sync(call: Callable[[list], Any]) -> Callable[[State], dict]:
        """The same as a ``def`` node."""

        def node(s: State) -> dict:
            out = []
            for i in range(calls_at(s["seed"], s["t"])):
                time.sleep(pause(s["seed"], s["t"], i))
                out.append(text(call(prompt(s["seed"], s["t"], i))))
            return {"answers": out}

        return node

    async def astreamed(messages: list) -> str:
        return "".join([str(c.content) async for c in policy.astream(messages)])

    def streamed(messages: list) -> str:
        return "".join(str(c.content) for c in policy.stream(messages))

    async def gather(s: State) -> dict:
        async def one(i: int) -> str:
            await asyncio.sleep(pause(s["seed"], s["t"], i))
            return text(await policy.ainvoke(prompt(s["seed"], s["t"], i)))

        return {"answers": list(await asyncio.gather(*(one(i) for i in range(calls_at(s["seed"], s["t"])))))}

    async def call(s: dict) -> dict:  # one Send branch
        await asyncio.sleep(pause(s["seed"], s["t"], s["i"]))
        return {"answers": [text(await policy.ainvoke(prompt(s["seed"], s["t"], s["i"])))]}

    def call_sync(s: dict) -> dict:
        time.sleep(pause(s["seed"], s["t"], s["i"]))
        return {"answers": [text(policy.invoke(prompt(s["seed"], s["t"], s["i"])))]}

    async def abatch(s: State) -> dict:
        await asyncio.sleep(pause(s["seed"], s["t"], 0))
        answers = await policy.abatch([prompt(s["seed"], s["t"], i) for i in range(calls_at(s["seed"], s["t"]))])
        return {"answers": [text(a) for a in answers]}

    def batch(s: State) -> dict:
        time.sleep(pause(s["seed"], s["t"], 0))
        answers = policy.batch([prompt(s["seed"], s["t"], i) for i in range(calls_at(s["seed"], s["t"]))])
        return {"answers": [text(a) for a in answers]}

    async def early(s: State) -> dict:
        return {"answers": [text(await policy.ainvoke(prompt(s["seed"], s["t"], 0)))]}

    async def late(s: State) -> dict:
        await asyncio.sleep(late_s)
        return {"answers": [text(await policy.ainvoke(prompt(s["seed"], s["t"], 1)))]}

    def early_sync(s: State) -> dict:
        return {"answers": [text(policy.invoke(prompt(s["seed"], s["t"], 0)))]}

    def late_sync(s: State) -> dict:
        time.sleep(late_s)
        return {"answers": [text(policy.invoke(prompt(s["seed"], s["t"], 1)))]}

    async def invoke_in_async(s: State) -> dict:
        return {
            "answers": [text(policy.invoke(prompt(s["seed"], s["t"], i))) for i in range(calls_at(s["seed"], s["t"]))]
        }

    async def stream_in_async(s: State) -> dict:
        return {"answers": [streamed(prompt(s["seed"], s["t"], i)) for i in range(calls_at(s["seed"], s["t"]))]}

    async def batch_in_async(s: State) -> dict:
        answers = policy.batch([prompt(s["seed"], s["t"], i) for i in range(calls_at(s["seed"], s["t"]))])
        return {"answers": [text(a) for a in answers]}

    nodes = {
        "ainvoke": one_by_one(policy.ainvoke),
        "invoke": one_by_one_sync(policy.invoke),
        "astream": one_by_one(astreamed),
        "stream": one_by_one_sync(streamed),
        "own_callbacks": one_by_one(lambda m: policy.ainvoke(m, config={"callbacks": [handler]})),
        "own_callbacks_sync": one_by_one_sync(lambda m: policy.invoke(m, config={"callbacks": [handler]})),
        "astructured": one_by_one(structured.ainvoke),
        "structured": one_by_one_sync(structured.invoke),
        "gather": gather,
        "call": call,
        "call_sync": call_sync,
        "abatch": abatch,
        "batch": batch,
        "early": early,
        "late": late,
        "early_sync": early_sync,
        "late_sync": late_sync,
        "invoke_in_async": invoke_in_async,
        "stream_in_async": stream_in_async,
        "batch_in_async": batch_in_async,
    }

    # ------------------------------------------------------------------ routing, judge, environment
    def route(s: State) -> Any:
        style = styles[(s["seed"] + s["t"]) % len(styles)]
        if style in ("send", "send_sync"):
            target = "call" if style == "send" else "call_sync"
            return [Send(target, {"seed": s["seed"], "t": s["t"], "i": i}) for i in range(calls_at(s["seed"], s["t"]))]
        if style in ("late", "late_sync"):
            return ["early", "late"] if style == "late" else ["early_sync", "late_sync"]
        return style

    async def judge_node(s: State) -> dict:
        verdict = await judge_model.ainvoke(judge_prompt(s["seed"], s["t"], (s["answers"] or [""])[-1]))
        await areport_reward(judge_score(str(verdict.content)))
        return {}

    async def environment(s: State) -> dict:
        t = s["t"] + 1
        done = t >= episode_length(s["seed"])
        await areport_reward(0.0 if judge else float(t), terminated=done, info={"success": done})
        return {"t": t, "done": done}

    async def next_step(s: State) -> Any:
        return END if s["done"] else route(s)

    g = StateGraph(State)
    for name, fn in nodes.items():
        g.add_node(name, fn)
        g.add_edge(name, "judge" if judge else "environment")
    if judge:
        g.add_node("judge", judge_node)
        g.add_edge("judge", "environment")
    g.add_node("environment", environment)
    g.add_conditional_edges(START, route, list(nodes))
    g.add_conditional_edges("environment", next_step, [*nodes, END])
    return g.compile(checkpointer=SAVER if checkpointer else None)
