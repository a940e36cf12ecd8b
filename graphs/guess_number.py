"""Guess the number: a multi-turn game whose agent keeps only a trimmed window of its history.

The environment hides a number in [1, 100] and answers each guess with "higher", "lower" or
"correct". The policy node sends the model the rules plus only the last ``history_turns``
exchanges, so prompts stay short however long the game runs: the recorder
still captures exactly what each call received.

Reward: 1 for finding the number (terminated); the game is cut after ``max_guesses`` (truncated).
"""

from __future__ import annotations

import random
import re
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.rollout.events import areport_reward

RULES = (
    "I am thinking of a whole number between 1 and 100. Guess it. After each guess I say whether "
    "the number is higher or lower. Answer with one line: GUESS: <number>."
)
_GUESS = re.compile(r"guess\s*:?\s*(-?\d+)", re.IGNORECASE)
_ANY_NUMBER = re.compile(r"-?\d+")


class State(TypedDict):
    secret: int
    history: list[BaseMessage]
    guesses: int
    done: bool


def make_input(seed: int) -> dict[str, Any]:
    """The game of episode ``seed``: a secret number drawn from the seed."""
    return {"secret": random.Random(seed).randint(1, 100), "history": [], "guesses": 0, "done": False}


def parse_guess(text: str) -> int | None:
    """The number after ``GUESS:``, else the last number in the answer, else None."""
    match = _GUESS.findall(text)
    numbers = match or _ANY_NUMBER.findall(text)
    return int(numbers[-1]) if numbers else None


def build_graph(model, history_turns: int = 2, max_guesses: int = 10, max_tokens: int = 32):
    """The game loop. ``history_turns``: how many past (guess, feedback) exchanges the model sees."""
    policy_model = model.bind(max_tokens=max_tokens)

    def prompt_for(history: list[BaseMessage]) -> list[BaseMessage]:
        window = history[-2 * history_turns :] if history_turns else []  # (guess, feedback) pairs
        return [SystemMessage(RULES), HumanMessage("Your first guess?"), *window]

    async def policy(state: State) -> dict:
        answer = await policy_model.ainvoke(prompt_for(state["history"]))
        return {"history": [*state["history"], answer]}

    async def environment(state: State) -> dict:
        answer = state["history"][-1]
        guess = parse_guess(answer.content if isinstance(answer, AIMessage) else "")
        guesses = state["guesses"] + 1
        if guess == state["secret"]:
            await areport_reward(1.0, terminated=True, info={"success": True, "guesses": guesses})
            return {"guesses": guesses, "done": True}
        cut = guesses >= max_guesses
        if guess is None:
            feedback = "That is not a number. Answer GUESS: <number>."
        else:
            feedback = f"{guess} is wrong: my number is {'higher' if state['secret'] > guess else 'lower'}."
        history = [*state["history"], HumanMessage(feedback)]
        # when the cap cuts the game, the prompt the next guess would get is the state to value
        await areport_reward(
            0.0,
            truncated=cut,
            info={"success": False, "guesses": guesses},
            next_messages=prompt_for(history) if cut else None,
        )
        return {"guesses": guesses, "done": cut, "history": history}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("environment", environment)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "environment")

    async def next_step(state: State) -> str:  # async: LangGraph runs sync functions in threads
        return END if state["done"] else "policy"

    graph.add_conditional_edges("environment", next_step, ["policy", END])
    return graph.compile()
