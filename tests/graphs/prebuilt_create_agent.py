"""LangChain's ``create_agent`` (the successor of LangGraph's prebuilt ReAct agent), as a
production service would build it: no verlog import, no reward, no make_input."""

from langchain.agents import create_agent


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def build_graph(model):
    return create_agent(model, tools=[add], system_prompt="Answer with a number. Use the add tool for sums.")
