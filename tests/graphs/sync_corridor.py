"""The cue corridor written the way most LangGraph examples are: ``def`` nodes calling
``model.invoke``, and two LLM nodes that sample at their own temperatures (``scout`` at 0.7
names a move it guesses, ``policy`` at 1.3 answers the move that is played).

Used by tests that check sync nodes train, roll out and evaluate like async ones, and that
each turn is scored at the temperature it was sampled with.
"""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph

from graphs.cue_corridor import MOVES, RIGHT_MOVE, State, cue_at, make_input, prompt_at  # noqa: F401
from verlog.rollout.events import report_reward

SCOUT_TEMPERATURE = 0.7
POLICY_TEMPERATURE = 1.3


def build_graph(model, length: int = 4, max_turns: int = 10) -> Any:
    scout_model = model.bind(max_tokens=1, temperature=SCOUT_TEMPERATURE)
    policy_model = model.bind(max_tokens=1, temperature=POLICY_TEMPERATURE)

    def scout(state: State) -> dict:
        scout_model.invoke(prompt_at(state["seed"], state["pos"], state["turn"], length))
        return {}

    def policy(state: State) -> dict:
        answer = policy_model.invoke(prompt_at(state["seed"], state["pos"], state["turn"], length))
        return {"answer": str(answer.content)}

    def environment(state: State) -> dict:
        cue = cue_at(state["seed"], state["turn"])
        words = state["answer"].split()
        move = words[0].lower() if words else ""
        pos = state["pos"] + 1 if move == RIGHT_MOVE[cue] else max(0, state["pos"] - 1)
        turn = state["turn"] + 1
        info = {"valid_action": move in MOVES, "position": pos}
        if pos >= length:
            report_reward(1.0, terminated=True, info={**info, "success": True})
            return {"pos": pos, "turn": turn, "done": True}
        cut = turn >= max_turns
        report_reward(
            0.0,
            truncated=cut,
            info={**info, "success": False},
            next_messages=prompt_at(state["seed"], pos, turn, length) if cut else None,
        )
        return {"pos": pos, "turn": turn, "done": cut}

    graph = StateGraph(State)
    graph.add_node("scout", scout)
    graph.add_node("policy", policy)
    graph.add_node("environment", environment)
    graph.add_edge(START, "scout")
    graph.add_edge("scout", "policy")
    graph.add_edge("policy", "environment")
    graph.add_conditional_edges("environment", lambda s: END if s["done"] else "scout", ["scout", END])
    return graph.compile()
