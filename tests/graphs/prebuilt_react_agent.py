"""LangGraph's prebuilt ReAct agent, exactly as a production service would build it: no verlog
import, no reward, no make_input. Trained from a dataset with a reward function outside it."""

from langgraph.prebuilt import create_react_agent

from tools.calculator import calculate


def build_graph(model):
    return create_react_agent(model, [calculate], prompt="Answer with a number. Use the calculate tool.")
