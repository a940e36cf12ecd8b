"""LangGraph's prebuilt ReAct agent, exactly as a production service would build it: no verlog
import, no reward, no make_input. Trained from a dataset with a reward function outside it."""

from langgraph.prebuilt import create_react_agent


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def build_graph(model):
    return create_react_agent(model, [add], prompt="Answer with a number. Use the add tool for sums.")
