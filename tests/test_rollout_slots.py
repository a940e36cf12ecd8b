"""Fixed-turn batching: exact quotas per slot, cut episodes that continue, bootstrap prompts that
are the held calls' prompts, failed episodes dropped and counted, new episodes in their slot.

A scripted engine plays the model; the graph, chat model, recorder and runner are the real ones.
Episode ``seed`` lasts ``2 + seed % 5`` turns; turn ``t`` pays ``t + 1`` (so every reward is
visible); the prompt names the seed and the turn, so a prompt says which state it is.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.backends.scripted import ScriptedEngine
from verlog.llm import VerlogChatModel
from verlog.rollout import areport_reward
from verlog.rollout.slots import SlotRunner, TurnGate


class State(TypedDict):
    seed: int
    t: int
    done: bool


def episode_length(seed: int) -> int:
    return 2 + seed % 5


def make_input(seed: int) -> dict:
    return {"seed": seed, "t": 0, "done": False}


def build_graph(model, fail_seeds=(), hang_seeds=()):
    async def policy(state: State) -> dict:
        await model.ainvoke([HumanMessage(f"seed {state['seed']} turn {state['t']}")])
        return {}

    async def environment(state: State) -> dict:
        seed, t = state["seed"], state["t"] + 1
        if seed in fail_seeds and t == 2:
            raise RuntimeError("the environment crashed")
        if seed in hang_seeds and t == 2:
            await asyncio.sleep(3600)
        done = t >= episode_length(seed)
        await areport_reward(float(t), terminated=done, info={"success": done, "valid_action": True})
        return {"t": t, "done": done}

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", lambda s: END if s["done"] else "policy", ["policy", END])
    return g.compile()


def make_runner(tokenizer, *, num_envs=3, turns_per_env=4, timeout_s=None, **graph_kwargs):
    engine = ScriptedEngine(tokenizer, ["go"])
    gate = TurnGate(engine, turns_per_env)
    model = VerlogChatModel(engine=gate, tokenizer=tokenizer, max_tokens=4)
    graph = build_graph(model, **graph_kwargs)
    runner = SlotRunner(
        graph, make_input, gate, num_envs=num_envs, graph_config={"recursion_limit": 100},
        timeout_s=timeout_s, seed=0,
    )
    return runner, engine


def state_of(tokenizer, prompt_ids) -> tuple[int, int]:
    """(seed, turn) named by a prompt."""
    seed, turn = re.search(r"seed (\d+) turn (\d+)", tokenizer.decode(prompt_ids)).groups()
    return int(seed), int(turn)


async def collect_batches(runner, n, pause_s=0.0):
    batches = []
    try:
        for _ in range(n):
            batches.append(await runner.collect())
            await asyncio.sleep(pause_s)  # stands for the update: every slot is held meanwhile
    finally:
        await runner.aclose()
    return batches


async def test_quota_continuation_bootstrap_and_new_episodes(tiny_tokenizer):
    runner, engine = make_runner(tiny_tokenizer)
    batches = await collect_batches(runner, 4)
    for b, batch in enumerate(batches):
        assert batch.num_envs == 3 and batch.turns_per_env == 4  # exactly the quota, every slot
        for i, turns in enumerate(batch.turns):
            for turn in turns:
                seed, t = state_of(tiny_tokenizer, turn.prompt_ids)
                assert seed % 3 == i  # slot i plays seeds i, i + 3, i + 6, ...
                assert turn.turn_index == t
                assert turn.reward == t + 1  # the env's reward reached every turn, the last included
                assert turn.terminated == (t + 1 == episode_length(seed))
            # consecutive turns: the same episode one turn on, or a new episode after a done turn
            for prev, nxt in zip(turns, turns[1:]):
                if prev.done:
                    assert nxt.turn_index == 0
                    assert state_of(tiny_tokenizer, nxt.prompt_ids)[0] == state_of(tiny_tokenizer, prev.prompt_ids)[0] + 3
                else:
                    assert (nxt.episode_id, nxt.turn_index) == (prev.episode_id, prev.turn_index + 1)
            # the held call at the boundary is the slot's next prompt
            if b + 1 < len(batches):
                following = batches[b + 1].turns[i][0]
                assert batch.bootstrap_prompt_ids[i] == following.prompt_ids
                last = turns[-1]
                if not last.done:  # cut episode: continues after the update, same episode
                    assert following.episode_id == last.episode_id
                    assert following.turn_index == last.turn_index + 1
                    assert not batches[b + 1].starts_episode[i]
                else:
                    assert following.turn_index == 0 and batches[b + 1].starts_episode[i]
    assert batches[0].starts_episode == [True, True, True]
    # every engine call is a training turn: held calls reach the engine only in the next batch
    assert len(engine.calls) == 4 * 3 * 4
    # episodes that ended are reported once, with their full return
    ended = [e for batch in batches for e in batch.episodes]
    assert len({e.episode_id for e in ended}) == len(ended) == runner.counters["episodes"]
    for episode in ended:
        n = len(episode.turns)
        assert episode.total_reward == n * (n + 1) / 2 and episode.info["success"]
    assert runner.counters["turns"] == 4 * 3 * 4 and runner.counters["batches"] == 4


async def test_nothing_runs_while_the_batch_is_held(tiny_tokenizer):
    runner, engine = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    try:
        await runner.collect()
        calls = len(engine.calls)
        await asyncio.sleep(0.2)  # the "update"
        assert len(engine.calls) == calls
        await runner.collect()
        assert len(engine.calls) == calls + 2 * 3
    finally:
        await runner.aclose()


async def test_failed_episodes_are_dropped_and_counted(tiny_tokenizer):
    # seeds 4 and 7 crash at their second env step; seed 5 hangs there until its timeout
    fail, hang = {4, 7}, {5}
    runner, _ = make_runner(tiny_tokenizer, fail_seeds=fail, hang_seeds=hang, timeout_s=1.0)
    batches = await collect_batches(runner, 4)
    failed_so_far: set[str] = set()
    for batch in batches:
        assert [len(t) for t in batch.turns] == [4, 4, 4]  # the shape holds
        failed_so_far |= {e.episode_id for e in batch.failed}
        for turns in batch.turns:
            for turn in turns:
                # no turn of a failed episode is in the batch that saw it fail (nor later); a turn
                # given to an earlier batch, before the failure, was a valid step and stays trained
                assert turn.episode_id not in failed_so_far
                seed, t = state_of(tiny_tokenizer, turn.prompt_ids)
                assert seed not in fail | hang or t == 0
    statuses = sorted(e.status for batch in batches for e in batch.failed)
    assert statuses == ["error", "error", "timeout"]
    assert runner.counters["failed"] == {"error": 2, "timeout": 1}
    assert len(failed_so_far) == 3


async def test_timeout_does_not_run_while_held(tiny_tokenizer):
    runner, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=2, timeout_s=0.5)
    batches = await collect_batches(runner, 3, pause_s=0.8)  # "updates" longer than the timeout
    assert not any(batch.failed for batch in batches)
    assert runner.counters["failed"] == {}


async def test_resume_counters_continue_seeds(tiny_tokenizer):
    runner, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    await collect_batches(runner, 2)
    state = runner.state_dict()
    again, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    again.load_state_dict(state)
    [batch] = await collect_batches(again, 1)
    for i, turns in enumerate(batch.turns):
        seed, t = state_of(tiny_tokenizer, turns[0].prompt_ids)
        assert t == 0 and seed == i + 2 * state["episodes_started"][i]  # the slot's next seed
    assert again.counters["turns"] == state["counters"]["turns"] + 6


async def test_a_graph_that_always_fails_stops_the_run(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["go"])
    gate = TurnGate(engine, 2)
    model = VerlogChatModel(engine=gate, tokenizer=tiny_tokenizer, max_tokens=4)
    runner = SlotRunner(build_graph(model, fail_seeds=set(range(1000))), make_input, gate, num_envs=2,
                        max_consecutive_failures=3)
    with pytest.raises(RuntimeError, match="in a row"):
        await collect_batches(runner, 1)
