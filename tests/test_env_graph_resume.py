"""A game graph's thread goes on in another process: the game is rebuilt from the saved state.

The state holds the seed and the answers the game was stepped with; a fresh graph (a restarted
server, another worker: its own, empty game table) resuming a thread from its checkpoint replays
them and ends the episode exactly as an uninterrupted run does. Each graph also carries the
recursion limit of its longest episode.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import MemorySaver

from verlog.envs.agent_graph import GameTable, build_game_graph, recursion_limit_for
from verlog.envs.base import StepResult, TextEnv

ANSWERS = (
    "ACTION: turn left",
    "ACTION: turn right",
    "ACTION: go forward",
    "ACTION: pick up",
    "ACTION: toggle",
    "ACTION: move left",
    "ACTION: move up",
    "ACTION: do",
    "I am not sure.",
    "north",
    "east",
    "south",
)


class PromptHashPolicy(BaseChatModel):
    """Answers from a hash of the prompt: the same state gets the same answer in any process."""

    @property
    def _llm_type(self) -> str:
        return "prompt-hash"

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        digest = hashlib.sha1("\n".join(str(m.content) for m in messages).encode()).digest()
        return ChatResult(generations=[ChatGeneration(message=AIMessage(ANSWERS[digest[0] % len(ANSWERS)]))])


def graph_of(env_name: str, saver: MemorySaver | None = None, **kwargs: Any):
    graph = build_game_graph(PromptHashPolicy(), env_name, **kwargs)
    return graph if saver is None else graph.copy(update={"checkpointer": saver})


async def play_until(graph, thread: dict, seed: int, steps: int) -> dict:
    """Run a thread until ``steps`` environment steps are checkpointed, then stop (a server dies)."""
    done = 0
    async for update in graph.astream({"seed": seed}, thread, stream_mode="updates"):
        if "environment" in update:
            done += 1
            if done == steps:
                break
    return (await graph.aget_state(thread)).values


@pytest.mark.parametrize(
    "env_name, protocol, max_steps",
    [
        ("babyai:goto", "verlog", 24),
        ("babyai:putnext", "balrog", 24),  # BALROG's note before an invalid answer's observation
        ("crafter", "verlog", 24),
        ("babaisai:goto_win", "verlog", 24),
        ("minihack:MazeWalk-9x9", "balrog", 24),  # the note heads the long-term part, after the inventory
    ],
)
async def test_a_thread_resumed_by_a_fresh_graph_ends_as_an_uninterrupted_run(env_name, protocol, max_steps):
    whole = await graph_of(env_name, protocol=protocol, max_steps=max_steps).ainvoke({"seed": 3})
    assert whole["steps"] == max_steps or whole["done"]

    saver = MemorySaver()
    thread = {"configurable": {"thread_id": "t1"}}
    first = graph_of(env_name, saver, protocol=protocol, max_steps=max_steps)
    cut = await play_until(first, thread, seed=3, steps=7)
    # the last step's checkpoint may not be written yet when the run stops: the thread resumes
    # from the last one that was (the next run steps a game rebuilt to that state)
    assert 5 <= cut["steps"] <= 7 and not cut["done"] and len(cut["actions"]) == cut["steps"]

    restarted = graph_of(env_name, saver, protocol=protocol, max_steps=max_steps)  # an empty game table
    resumed = await restarted.ainvoke(None, thread)
    for key in ("steps", "episode_return", "done", "observation", "actions", "seed"):
        assert resumed[key] == whole[key], key
    assert [list(pair) for pair in resumed["history"]] == [list(pair) for pair in whole["history"]]


async def test_a_state_the_game_does_not_reproduce_fails_the_step_clearly():
    saver = MemorySaver()
    thread = {"configurable": {"thread_id": "t2"}}
    await play_until(graph_of("babyai:goto", saver, max_steps=16), thread, seed=1, steps=3)
    restarted = graph_of("babyai:goto", saver, max_steps=16)
    # the saved state says the game shows something replaying its answers does not reach
    await restarted.aupdate_state(thread, {"observation": "You see a purple dragon."})
    with pytest.raises(RuntimeError, match="did not reach the saved observation: the game is not deterministic"):
        await restarted.ainvoke(None, thread)


async def test_an_input_without_a_seed_gets_one_the_state_keeps():
    saver = MemorySaver()
    thread = {"configurable": {"thread_id": "t3"}}
    state = await play_until(graph_of("babyai:goto", saver, max_steps=8), thread, seed=None, steps=2)  # type: ignore[arg-type]
    assert isinstance(state["seed"], int)
    resumed = await graph_of("babyai:goto", saver, max_steps=8).ainvoke(None, thread)
    assert resumed["steps"] == 8 or resumed["done"]


class CountedEnv(TextEnv):
    instruction = ""

    def __init__(self) -> None:
        self.closed = False

    def reset(self, seed: int | None = None) -> str:
        return ""

    def step(self, text: str) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


def test_game_table_closes_the_least_recently_used_and_the_idle(monkeypatch):
    table = GameTable(max_games=2, idle_s=100.0)
    now = [0.0]
    monkeypatch.setattr("verlog.envs.agent_graph.time.monotonic", lambda: now[0])
    a, b, c, d = (CountedEnv() for _ in range(4))
    table.add("a", a)
    table.add("b", b)
    assert table.get("a") is a  # a is now the most recently used
    table.add("c", c)
    assert b.closed and "b" not in table and not a.closed and len(table) == 2
    now[0] = 150.0
    table.add("d", d)  # a and c were idle 150 s > 100 s
    assert a.closed and c.closed and list(table._games) == ["d"]
    table.close("d")
    assert d.closed and len(table) == 0


@pytest.mark.parametrize(
    "env_name, protocol, cap",
    [
        ("babyai:goto", "verlog", 128),
        ("babyai:goto", "balrog", 64),  # minigrid's cap, set when the level is generated
        ("babyai:putnext", "balrog", 128),
        ("crafter", "balrog", 2000),
        ("textworld:treasure_hunter", "balrog", 80),
    ],
)
def test_each_game_graph_carries_the_recursion_limit_of_its_longest_episode(env_name, protocol, cap):
    assert graph_of(env_name, protocol=protocol).config["recursion_limit"] == recursion_limit_for(cap)
    assert graph_of(env_name, protocol=protocol, max_steps=10).config["recursion_limit"] == recursion_limit_for(10)
