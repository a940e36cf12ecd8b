"""The agent loop of every text game: reset → (memory → policy → environment)* → end.

* ``memory`` builds the prompt: the game's instruction as the system message, the last
  ``history_turns`` (observation, answer) exchanges, then ``Current Observation:`` — Verlog's
  default is one previous exchange, so a prompt stays the same size however long the episode.
* ``policy`` asks the model for an answer (free reasoning, then ``ACTION: <action>``).
* ``environment`` steps the game with the answer text and reports the reward, the episode end
  and the step's info through LangChain's callback channel (``areport_reward``).

The graph files ``graphs/babyai.py``, ``graphs/babaisai.py`` and ``graphs/crafter.py`` are thin
wrappers choosing the game. Every node and router is ``async``: in an async run LangGraph
executes sync functions in a thread pool, a thread hop per step. The live game objects stay outside the graph state (keyed by a
per-episode id) so the state remains plain, checkpointable data. Games are built and reset in
a worker thread (TextWorld generates a game on first use); steps run on the event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.envs.base import TextEnv
from verlog.envs.registry import make_env
from verlog.rollout.events import areport_reward

#: most games kept alive at once by one graph (episodes that crashed are evicted oldest first)
MAX_LIVE_GAMES = 4096


class GameState(TypedDict, total=False):
    """The graph state of one episode (plain data only)."""

    seed: int
    game_id: str
    instruction: str
    observation: str
    #: past (observation, answer) exchanges, oldest first
    history: list[tuple[str, str]]
    prompt: list[BaseMessage]
    answer: str
    feedback: str
    steps: int
    episode_return: float
    done: bool
    info: dict[str, Any]


def build_prompt(
    instruction: str, history: list[tuple[str, str]], observation: str, history_turns: int | None, feedback: str = ""
) -> list[BaseMessage]:
    """The messages of one policy call. ``history_turns=None`` keeps the whole history."""
    window = history if history_turns is None else (history[-history_turns:] if history_turns > 0 else [])
    messages: list[BaseMessage] = [SystemMessage(instruction)]
    for past_observation, past_answer in window:
        messages += [HumanMessage(f"Observation:\n{past_observation}"), AIMessage(past_answer)]
    note = f"{feedback}\n\n" if feedback else ""
    messages.append(HumanMessage(f"{note}Current Observation:\n{observation}"))
    return messages


def build_env_graph(
    model: Any,
    env_name: str,
    *,
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
):
    """A compiled graph playing ``env_name`` with ``model``.

    Args:
        history_turns: past exchanges shown to the model (``None``: all of them).
        max_tokens: the policy call's response budget (default: the model's own).
        env_kwargs: passed to ``make_env`` (``max_steps``, ``invalid_action_penalty``, ...).
    """
    policy_model = model.bind(max_tokens=max_tokens) if max_tokens else model
    games: OrderedDict[str, TextEnv] = OrderedDict()

    def game_of(state: GameState) -> TextEnv:
        try:
            return games[state["game_id"]]
        except KeyError:
            raise RuntimeError(f"game {state.get('game_id')!r} is not running (graph state from another process?)") from None

    def start_game(seed: int | None) -> tuple[TextEnv, str]:
        env = make_env(env_name, **(env_kwargs or {}))
        return env, env.reset(seed)

    async def reset(state: GameState) -> dict:
        # in a worker thread: building a game can take seconds (TextWorld generates and compiles
        # one on first use), which must not stall the other episodes on the event loop
        env, observation = await asyncio.to_thread(start_game, state.get("seed"))
        game_id = uuid.uuid4().hex
        games[game_id] = env
        while len(games) > MAX_LIVE_GAMES:
            games.popitem(last=False)[1].close()
        return {
            "game_id": game_id, "instruction": env.instruction, "observation": observation,
            "history": [], "feedback": "", "steps": 0, "episode_return": 0.0, "done": False, "info": {},
        }

    async def memory(state: GameState) -> dict:
        prompt = build_prompt(
            state["instruction"], state["history"], state["observation"], history_turns, state.get("feedback", "")
        )
        return {"prompt": prompt}

    async def policy(state: GameState) -> dict:
        answer = await policy_model.ainvoke(state["prompt"])
        return {"answer": answer.content if isinstance(answer.content, str) else str(answer.content)}

    async def environment(state: GameState) -> dict:
        env = game_of(state)
        result = env.step(state["answer"])
        await areport_reward(result.reward, terminated=result.terminated, truncated=result.truncated, info=result.info)
        feedback = ""
        if not result.info.get("valid_action", True):
            feedback = f"Your last answer named no valid action, so '{result.info.get('action')}' was done instead."
        if result.done:
            games.pop(state["game_id"], None)
            env.close()
        return {
            "history": [*state["history"], (state["observation"], state["answer"])],
            "observation": result.observation,
            "feedback": feedback,
            "steps": state["steps"] + 1,
            "episode_return": state["episode_return"] + result.reward,
            "done": result.done,
            "info": result.info,
        }

    graph = StateGraph(GameState)
    graph.add_node("reset", reset)
    graph.add_node("memory", memory)
    graph.add_node("policy", policy)
    graph.add_node("environment", environment)
    graph.add_edge(START, "reset")
    graph.add_edge("reset", "memory")
    graph.add_edge("memory", "policy")
    graph.add_edge("policy", "environment")
    async def next_step(state: GameState) -> str:
        return END if state["done"] else "memory"

    graph.add_conditional_edges("environment", next_step, ["memory", END])
    return graph.compile()


def recursion_limit_for(max_steps: int) -> int:
    """A recursion limit that lets an episode of ``max_steps`` steps finish (3 nodes per step)."""
    return 3 * max_steps + 10
