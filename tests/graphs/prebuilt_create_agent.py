"""LangChain's ``create_agent`` (the successor of LangGraph's prebuilt ReAct agent), as a
production service would build it: no verlog import, no reward, no make_input."""

from langchain.agents import create_agent

from tools.calculator import calculate


def build_graph(model):
    return create_agent(model, tools=[calculate], system_prompt="Answer with a number. Use the calculate tool.")
