"""A ReAct calculator agent: the model answers arithmetic questions with the calculator tool.

Loop: ``agent`` (the model, tools bound) -> ``tools`` (runs its tool calls, or shows it the
malformed ones) -> ``agent`` ... until the model answers without a tool call, or after
``max_tool_rounds`` rounds of tools. The input is a conversation (``{"messages": [...]}``): a
user's question; the agent puts its own system prompt first.

This is production code: nothing in it knows about training. ``verlog train
configs/calculator.yaml`` trains it on the question/answer rows of ``data/calculator/`` with
the reward function ``rewards/calculator.py:correct`` (see docs/train_your_agent.md); ``verlog
serve graphs/calculator.py`` serves it unchanged.
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from tools.calculator import calculate

SYSTEM = (
    "You are a careful assistant. Use the calculate tool for arithmetic, then give the final "
    "answer as a number on the last line. For example, for 12 * 7 first answer only\n"
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * 7"}}\n</tool_call>\n'
    "and once the tool has answered 84, answer: 84"
)


def build_graph(model, max_tool_rounds: int = 4, system_prompt: str = SYSTEM, require_tool: bool = False):
    """The ReAct graph; ``max_tool_rounds`` bounds how many tool rounds one question may take,
    ``system_prompt`` is put first when the conversation has no system message, and with
    ``require_tool`` the first answer to a question must be a tool call (``tool_choice="required"``,
    as agents that must look things up are often built)."""
    tools = [calculate]
    agent_model = model.bind_tools(tools)
    first_model = model.bind_tools(tools, tool_choice="required") if require_tool else agent_model
    run_tools = ToolNode(tools)

    async def agent(state: MessagesState) -> dict:
        messages = state["messages"]
        if not messages or messages[0].type != "system":
            messages = [SystemMessage(system_prompt), *messages]
        asked = first_model if messages[-1].type == "human" else agent_model
        return {"messages": [await asked.ainvoke(messages)]}

    async def act(state: MessagesState) -> dict:
        last = state["messages"][-1]
        replies: list[ToolMessage] = []
        if last.tool_calls:
            replies += (await run_tools.ainvoke({"messages": [last]}))["messages"]
        for bad in last.invalid_tool_calls:  # show the model its malformed call
            replies.append(ToolMessage(f"Error: {bad['error']}", tool_call_id=bad["id"] or "invalid", status="error"))
        return {"messages": replies}

    async def route(state: MessagesState) -> str:  # async: LangGraph runs sync functions in threads
        last = state["messages"][-1]
        rounds = sum(isinstance(m, AIMessage) for m in state["messages"])
        if (last.tool_calls or last.invalid_tool_calls) and rounds <= max_tool_rounds:
            return "act"
        return END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("act", act)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["act", END])
    graph.add_edge("act", "agent")
    return graph.compile().with_config(recursion_limit=3 * max_tool_rounds + 5)
