"""The slots of a group stay in step: a slot that falls behind joins its group's newest round, so
episodes of one task (what a group estimator compares) keep ending in the same batches.

Slot 0's episodes last 1 turn, slot 1's 3 (the graph reads its slot from the episode id), both
slots in one group. With each slot simply counting its own rounds, slot 1 would fall further
behind every batch and the two would soon never finish a task in the same batch."""

from __future__ import annotations

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.llm import VerlogChatModel
from verlog.llm.chat_model import EPISODE_ID_KEY
from verlog.rollout import areport_reward
from verlog.rollout.schedule import slot_seed
from verlog.rollout.slots import SlotRunner
from verlog.testing import ScriptedEngine


class State(TypedDict):
    seed: int
    t: int
    done: bool


def build_graph(model):
    async def policy(state: State) -> dict:
        await model.ainvoke([HumanMessage(f"seed {state['seed']} turn {state['t']}")])
        return {}

    async def environment(state: State, config: RunnableConfig) -> dict:
        slot = int(config["metadata"][EPISODE_ID_KEY].split("-")[0].removeprefix("slot"))
        t = state["t"] + 1
        done = t >= (1 if slot == 0 else 3)
        await areport_reward(1.0 if done else 0.0, terminated=done)
        return {"t": t, "done": done}

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", lambda s: END if s["done"] else "policy", ["policy", END])
    return g.compile()


class OwnRounds(SlotRunner):
    """The control: every slot plays its own next round, whatever its group does."""

    def _next_seed(self, slot):
        j = slot.episodes_started
        slot.episodes_started += 1
        return slot_seed(self.seed, j, slot.index // self.group_size, self.num_envs // self.group_size)


async def shared_tasks_per_batch(tokenizer, runner_class, batches=6) -> list[int]:
    """For each batch, how many seeds both slots completed in it."""
    engine = ScriptedEngine(tokenizer, ["go"])
    runner = runner_class(
        engine,
        lambda gated: build_graph(VerlogChatModel(engine=gated, tokenizer=tokenizer, max_tokens=4)),
        lambda seed: {"seed": seed, "t": 0, "done": False},
        num_envs=2,
        turns_per_env=6,
        group_size=2,
    )
    shared = []
    try:
        for _ in range(batches):
            batch = await runner.collect()
            completed = [{}, {}]
            for episode in batch.episodes:
                slot = int(episode.episode_id.split("-")[0].removeprefix("slot"))
                starts = [i for i, t in enumerate(batch.turns[slot]) if t.episode_id == episode.episode_id]
                if starts and episode.turns[0] is batch.turns[slot][starts[0]]:  # begun in this batch
                    completed[slot][episode.episode_id] = batch.seeds[slot][starts[0]]
            shared.append(len(set(completed[0].values()) & set(completed[1].values())))
    finally:
        await runner.aclose()
    return shared


async def test_a_group_stays_in_step(tiny_tokenizer):
    in_step = await shared_tasks_per_batch(tiny_tokenizer, SlotRunner)
    own_rounds = await shared_tasks_per_batch(tiny_tokenizer, OwnRounds)
    assert all(n >= 1 for n in in_step[1:]), in_step  # every batch compares plays of one task
    assert sum(own_rounds[2:]) == 0, own_rounds  # the control drifts apart for good
