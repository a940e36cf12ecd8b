"""Cue corridor: a multi-turn game with a delayed reward, small enough to learn on a CPU.

The agent stands at position 0 of a corridor of ``length`` cells. Each turn it sees its position
and a coloured cue; the right move is a fixed function of the cue (red -> east, green -> north,
blue -> west, yellow -> south). A right move steps forward, a wrong one steps back (not below 0).
Only reaching the end pays: reward 1 and the episode terminates. After ``max_turns`` turns the
episode is cut (truncated). As in Verlog's environments, an answer that is not a move at all is
an invalid action: it counts as a wrong move and costs ``invalid_penalty``.

A random policy over a 40-word vocabulary never succeeds; one that only answers valid moves, at
random, succeeds about 3% of the time. Getting further means learning which move each cue asks
for from the delayed reward alone (the penalty is the same for every valid move).

Used by verlog's CPU learning proof with the word-level toy model
(``verlog.models.toy``); any chat model can play it (answer with one word).
"""

from __future__ import annotations

import random
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.rollout.events import areport_reward

CUES = ("red", "green", "blue", "yellow")
#: the right move for each cue
RIGHT_MOVE = {"red": "east", "green": "north", "blue": "west", "yellow": "south"}
MOVES = ("north", "south", "east", "west")
RULES = "walk the corridor"


class State(TypedDict):
    seed: int
    pos: int
    turn: int
    answer: str
    done: bool


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed``: its cues are drawn from the seed, one per turn."""
    return {"seed": seed, "pos": 0, "turn": 0, "answer": "", "done": False}


def cue_at(seed: int, turn: int) -> str:
    """The cue shown at ``turn`` of episode ``seed``."""
    return random.Random(seed * 1009 + turn).choice(CUES)


def prompt_at(seed: int, pos: int, turn: int, length: int) -> list:
    """What the model is shown at ``pos`` on ``turn`` of episode ``seed``."""
    return [SystemMessage(RULES), HumanMessage(f"pos {pos} of {length} cue {cue_at(seed, turn)}")]


def build_graph(model, length: int = 4, max_turns: int = 10, max_tokens: int = 1, invalid_penalty: float = 0.1):
    """The corridor loop: ``policy`` answers one word, ``environment`` moves and rewards."""
    policy, environment = corridor_nodes(model, length, max_turns, max_tokens, invalid_penalty)
    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("environment", environment)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "environment")
    graph.add_conditional_edges("environment", lambda s: END if s["done"] else "policy", ["policy", END])
    return graph.compile()


def corridor_nodes(model, length: int = 4, max_turns: int = 10, max_tokens: int = 1, invalid_penalty: float = 0.1):
    """The game's two nodes, ``(policy, environment)``, for graphs that add their own around them."""
    policy_model = model.bind(max_tokens=max_tokens)

    async def policy(state: State) -> dict:
        answer = await policy_model.ainvoke(prompt_at(state["seed"], state["pos"], state["turn"], length))
        return {"answer": str(answer.content)}

    async def environment(state: State) -> dict:
        cue = cue_at(state["seed"], state["turn"])
        words = state["answer"].split()
        move = words[0].lower() if words else ""
        pos = state["pos"] + 1 if move == RIGHT_MOVE[cue] else max(0, state["pos"] - 1)
        turn = state["turn"] + 1
        valid = move in MOVES
        penalty = 0.0 if valid else -invalid_penalty
        # "anchor": the state this turn acted in (what the model saw: position and cue), for GiGPO
        info = {"valid_action": valid, "position": pos, "anchor": f"{state['pos']}:{cue}"}
        if pos >= length:
            await areport_reward(1.0 + penalty, terminated=True, info={**info, "success": True})
            return {"pos": pos, "turn": turn, "done": True}
        cut = turn >= max_turns
        # a cut episode's next state still has a value: show the trainer the prompt it would be
        next_messages = prompt_at(state["seed"], pos, turn, length) if cut else None
        await areport_reward(penalty, truncated=cut, info={**info, "success": False}, next_messages=next_messages)
        return {"pos": pos, "turn": turn, "done": cut}

    return policy, environment
