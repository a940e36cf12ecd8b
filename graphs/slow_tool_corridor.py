"""The cue corridor (``graphs/cue_corridor.py``) with a slow tool: an agent whose every step first
calls a tool that takes seconds in some episodes (a web call, a code run, a judge), as production
agents do.

Each turn the policy answers a move; before the environment applies it, a ``tool`` node waits
``uniform(0, max_delay_s)`` seconds (drawn from the episode's seed and turn) in one episode of
``slow_every`` (seeds ``0, slow_every, 2 * slow_every, ...``), and not at all in the others. The game,
its rewards and what the model sees are the cue corridor's, so a policy learns it alike whatever the
delays: what the delays change is how long a batch takes to collect. ``benchmarks/slow_tools.py``
trains it with and without straggler-tolerant batches (``trainer.stragglers``).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from langgraph.graph import END, START, StateGraph

from graphs.cue_corridor import State, corridor_nodes, make_input

__all__ = ["build_graph", "make_input", "tool_delay"]


def tool_delay(seed: int, turn: int, max_delay_s: float, slow_every: int) -> float:
    """Seconds the tool takes at ``turn`` of episode ``seed``."""
    if slow_every <= 0 or seed % slow_every:
        return 0.0
    return random.Random(seed * 7919 + turn).uniform(0.0, max_delay_s)


def build_graph(model, max_delay_s: float = 4.0, slow_every: int = 4, **corridor: Any):
    """The corridor's ``policy`` and ``environment`` nodes with a ``tool`` node between them."""
    policy, environment = corridor_nodes(model, **corridor)

    async def tool(state: State) -> dict:
        await asyncio.sleep(tool_delay(state["seed"], state["turn"], max_delay_s, slow_every))
        return {}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("tool", tool)
    graph.add_node("environment", environment)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "tool")
    graph.add_edge("tool", "environment")
    graph.add_conditional_edges("environment", lambda s: END if s["done"] else "policy", ["policy", END])
    return graph.compile()
