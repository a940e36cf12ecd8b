"""An ``async def`` node that hands a blocking ``model.invoke`` to ``loop.run_in_executor``.

Each step's ``policy`` node makes one call the usual way (``await model.ainvoke``) and one
through the loop's executor in the chosen ``style``:

==============  ======================================================================
``executor``    ``loop.run_in_executor(None, model.invoke, messages)``: LangChain's context
                does not reach the thread, so the call is answered but not trained
``to_thread``   ``asyncio.to_thread(model.invoke, messages)``: the context goes along
``config``      ``loop.run_in_executor(None, model.invoke, messages, config)``: the node's
                config goes along
==============  ======================================================================

The environment pays 1 per step and ends the episode after ``steps`` steps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.rollout import areport_reward


class State(TypedDict):
    seed: int
    t: int


def make_input(seed: int) -> dict:
    return {"seed": seed, "t": 0}


def build_graph(model, style: str = "executor", steps: int = 2) -> Any:
    model = model.bind(max_tokens=2)

    async def policy(state: State, config: RunnableConfig) -> dict:
        messages = [HumanMessage(f"seed {state['seed']} step {state['t']}")]
        await model.ainvoke(messages)
        loop = asyncio.get_running_loop()
        if style == "executor":
            await loop.run_in_executor(None, model.invoke, messages)
        elif style == "to_thread":
            await asyncio.to_thread(model.invoke, messages)
        elif style == "config":
            await loop.run_in_executor(None, model.invoke, messages, config)
        else:
            raise ValueError(f"unknown style {style!r}")
        return {}

    async def environment(state: State) -> dict:
        t = state["t"] + 1
        await areport_reward(1.0, terminated=t >= steps)
        return {"t": t}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("environment", environment)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "environment")
    graph.add_conditional_edges("environment", lambda s: END if s["t"] >= steps else "policy", ["policy", END])
    return graph.compile()
