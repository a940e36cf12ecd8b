"""A ReAct calculator agent: the model answers arithmetic questions using the calculator tool.

Loop: ``agent`` (model with tools) -> ``tools`` (runs its tool calls, or reports malformed ones)
-> ``agent`` ... until the model answers without a tool call; ``grade`` then compares the last
number of the answer with the true result and reports reward 1 or 0.

Runs unchanged in training (verlog's chat model), evaluation and production (any chat model
with tool calling).
"""

from __future__ import annotations

import random
import re
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from tools.calculator import calculate
from verlog.rollout.events import areport_reward

SYSTEM = (
    "You are a careful assistant. Use the calculate tool for arithmetic, then give the final "
    "answer as a number on the last line."
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class State(MessagesState):
    target: float


def make_input(seed: int) -> dict[str, Any]:
    """A random two-operation arithmetic question for episode ``seed``."""
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    op = rng.choice(["+", "-", "*"])
    expression = f"({a} {op} {b}) * {c}"
    return {
        "messages": [SystemMessage(SYSTEM), HumanMessage(f"What is {expression}?")],
        "target": float(calculate(expression)),
    }


def build_graph(model, max_tool_rounds: int = 4):
    """The ReAct graph; ``max_tool_rounds`` bounds how many tool rounds one question may take."""
    tools = [calculate]
    agent_model = model.bind_tools(tools)
    run_tools = ToolNode(tools)

    async def agent(state: State) -> dict:
        return {"messages": [await agent_model.ainvoke(state["messages"])]}

    async def act(state: State) -> dict:
        last = state["messages"][-1]
        replies: list[ToolMessage] = []
        if last.tool_calls:
            replies += (await run_tools.ainvoke({"messages": [last]}))["messages"]
        for bad in last.invalid_tool_calls:  # show the model its malformed call
            replies.append(
                ToolMessage(f"Error: {bad['error']}", tool_call_id=bad["id"] or "invalid", status="error")
            )
        return {"messages": replies}

    async def grade(state: State) -> dict:
        answer = state["messages"][-1]
        numbers = _NUMBER.findall(answer.content if isinstance(answer.content, str) else "")
        success = bool(numbers) and abs(float(numbers[-1]) - state["target"]) < 1e-6
        await areport_reward(1.0 if success else 0.0, terminated=True, info={"success": success})
        return {}

    async def route(state: State) -> str:  # async: LangGraph runs sync functions in threads
        last = state["messages"][-1]
        rounds = sum(isinstance(m, AIMessage) for m in state["messages"])
        if (last.tool_calls or last.invalid_tool_calls) and rounds <= max_tool_rounds:
            return "act"
        return "grade"

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("act", act)
    graph.add_node("grade", grade)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["act", "grade"])
    graph.add_edge("act", "agent")
    graph.add_edge("grade", END)
    return graph.compile()
