"""Fixed-turn batching: exact quotas per slot, cut episodes that continue, bootstrap prompts that
are the held calls' prompts, failed episodes dropped and counted, new episodes in their slot.

A scripted engine plays the model; the graph, chat model, recorder and runner are the real ones.
Episode ``seed`` lasts ``2 + seed % 5`` turns; turn ``t`` pays ``t + 1`` (so every reward is
visible); the prompt names the seed and the turn, so a prompt says which state it is.
"""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.graph_file import GraphFileError
from verlog.llm import VerlogChatModel
from verlog.rollout import SlotFailureError, areport_reward, report_reward
from verlog.rollout.slots import SlotRunner
from verlog.testing import ScriptedEngine


class State(TypedDict):
    seed: int
    t: int
    done: bool


def episode_length(seed: int) -> int:
    return 2 + seed % 5


def make_input(seed: int) -> dict:
    return {"seed": seed, "t": 0, "done": False}


def slot_of(seed: int, groups: int = 3) -> int:
    """The slot (of ``groups``) that plays ``seed``: its j-th episode plays j*G + (slot + j) % G."""
    return (seed % groups - seed // groups) % groups


def slot_of_first(slot: int, groups: int = 3) -> int:
    """The seed slot ``slot`` plays first (its round 0)."""
    return next(seed for seed in range(groups) if slot_of(seed, groups) == slot)


def next_seed(seed: int, groups: int = 3) -> int:
    """The seed the same slot plays after ``seed``."""
    j = seed // groups + 1
    return j * groups + (slot_of(seed, groups) + j) % groups


def prompt(seed: int, t: int) -> list:
    return [HumanMessage(f"seed {seed} turn {t}")]


def build_graph(model, fail_seeds=(), hang_seeds=(), sync=False, cap=None, block_turn=None, threads=None):
    """The scripted game; ``sync``: ``def`` nodes calling ``model.invoke`` (the style of most
    LangGraph examples); ``cap``: a step cap after which the episode is truncated; ``block_turn``:
    the turn whose ``async def`` policy node calls ``model.invoke`` (a blocking call, as production
    graphs may make); ``threads``: a list each policy node appends ``(seed, turn, its thread)`` to."""

    def outcome(state: State) -> tuple[int, bool, bool]:
        seed, t = state["seed"], state["t"] + 1
        if seed in fail_seeds and t == 2:
            raise RuntimeError("the environment crashed")
        terminated = t >= episode_length(seed)
        return t, terminated, not terminated and cap is not None and t >= cap

    async def policy(state: State) -> dict:
        if threads is not None:
            threads.append((state["seed"], state["t"], threading.current_thread().name))
        if state["t"] == block_turn:
            model.invoke(prompt(state["seed"], state["t"]))
        else:
            await model.ainvoke(prompt(state["seed"], state["t"]))
        return {}

    async def environment(state: State) -> dict:
        t, terminated, truncated = outcome(state)
        if state["seed"] in hang_seeds and t == 2:
            await asyncio.sleep(3600)
        await areport_reward(
            float(t),
            terminated=terminated,
            truncated=truncated,
            info={"success": terminated, "valid_action": True},
            next_messages=prompt(state["seed"], t) if truncated else None,
        )
        return {"t": t, "done": terminated or truncated}

    def sync_policy(state: State) -> dict:
        model.invoke(prompt(state["seed"], state["t"]))
        return {}

    def sync_environment(state: State) -> dict:
        t, terminated, truncated = outcome(state)
        if state["seed"] in hang_seeds and t == 2:
            import time

            time.sleep(3)
        report_reward(
            float(t),
            terminated=terminated,
            truncated=truncated,
            info={"success": terminated, "valid_action": True},
            next_messages=prompt(state["seed"], t) if truncated else None,
        )
        return {"t": t, "done": terminated or truncated}

    if sync:
        policy, environment = sync_policy, sync_environment

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", lambda s: END if s["done"] else "policy", ["policy", END])
    return g.compile()


def make_runner(
    tokenizer,
    *,
    num_envs=3,
    turns_per_env=4,
    timeout_s=None,
    max_consecutive_failures=20,
    slot_threads="auto",
    **graph_kwargs,
):
    engine = ScriptedEngine(tokenizer, ["go"])
    models = []

    def build(gated):
        models.append(VerlogChatModel(engine=gated, tokenizer=tokenizer, max_tokens=4))
        return build_graph(models[-1], **graph_kwargs)

    runner = SlotRunner(
        engine,
        build,
        make_input,
        num_envs=num_envs,
        turns_per_env=turns_per_env,
        graph_config={"recursion_limit": 100},
        timeout_s=timeout_s,
        seed=0,
        max_consecutive_failures=max_consecutive_failures,
        render_prompt=lambda messages, tools: models[0].render_prompt_ids(messages, tools),
        slot_threads=slot_threads,
    )
    return runner, engine


def state_of(tokenizer, prompt_ids) -> tuple[int, int]:
    """(seed, turn) named by a prompt."""
    seed, turn = re.search(r"seed (\d+) turn (\d+)", tokenizer.decode(prompt_ids)).groups()
    return int(seed), int(turn)


async def collect_batches(runner, n, pause_s=0.0):
    batches = []
    try:
        for b in range(n):
            batches.append(await runner.collect())
            if b < n - 1:
                await asyncio.sleep(pause_s)  # stands for the update: every slot is held meanwhile
    finally:
        await runner.aclose()
    return batches


@pytest.mark.parametrize("sync", [False, True], ids=["async-nodes", "sync-nodes"])
async def test_quota_continuation_bootstrap_and_new_episodes(tiny_tokenizer, sync):
    runner, engine = make_runner(tiny_tokenizer, sync=sync)
    batches = await collect_batches(runner, 4)
    for b, batch in enumerate(batches):
        assert batch.num_envs == 3 and batch.turns_per_env == 4  # exactly the quota, every slot
        for i, turns in enumerate(batch.turns):
            for turn in turns:
                seed, t = state_of(tiny_tokenizer, turn.prompt_ids)
                assert slot_of(seed) == i  # slot i's j-th episode plays seed 3j + (i + j) % 3
                assert turn.turn_index == t
                assert turn.reward == t + 1  # the env's reward reached every turn, the last included
                assert turn.terminated == (t + 1 == episode_length(seed))
            # consecutive turns: the same episode one turn on, or a new episode after a done turn
            for prev, nxt in zip(turns, turns[1:]):
                if prev.done:
                    assert nxt.turn_index == 0
                    assert state_of(tiny_tokenizer, nxt.prompt_ids)[0] == next_seed(
                        state_of(tiny_tokenizer, prev.prompt_ids)[0]
                    )
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
    assert len({e.episode_id for e in ended}) == len(ended) == runner.counters.episodes
    for episode in ended:
        n = len(episode.turns)
        assert episode.total_reward == n * (n + 1) / 2 and episode.info["success"]
    assert runner.counters.turns == 4 * 3 * 4 and runner.counters.batches == 4
    # the highest seed begun is that of an episode in flight at the last boundary (a held call)
    assert runner.highest_task == max(state_of(tiny_tokenizer, p)[0] for p in batches[-1].bootstrap_prompt_ids)


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


@pytest.mark.parametrize("sync", [False, True], ids=["async-nodes", "sync-nodes"])
async def test_failed_episodes_are_dropped_and_counted(tiny_tokenizer, sync):
    # seeds 4 and 7 crash at their second env step; seed 5 hangs there past its timeout
    fail, hang = {4, 7}, {5}
    runner, _ = make_runner(tiny_tokenizer, fail_seeds=fail, hang_seeds=hang, timeout_s=1.0, sync=sync)
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
    assert runner.counters.failed == {"error": 2, "timeout": 1}
    assert len(failed_so_far) == 3


@pytest.mark.parametrize("sync", [False, True], ids=["async-nodes", "sync-nodes"])
async def test_timeout_does_not_run_while_held(tiny_tokenizer, sync):
    # the timeout leaves a loaded machine's graph code (up to 6 turns of thread hops) ample room;
    # each "update" alone outlasts it, so one held update counted as the graph's time fails the test
    runner, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=2, timeout_s=2.0, sync=sync)
    batches = await collect_batches(runner, 3, pause_s=2.5)
    assert not any(batch.failed for batch in batches)
    assert runner.counters.failed == {}


async def test_resume_counters_continue_seeds(tiny_tokenizer):
    runner, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    await collect_batches(runner, 2)
    state = runner.state_dict()
    again, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    assert again.highest_task is None  # no episode begun yet
    again.load_state_dict(state)
    assert again.highest_task == runner.highest_task  # read back from the checkpoint's rounds
    [batch] = await collect_batches(again, 1)
    for i, turns in enumerate(batch.turns):
        seed, t = state_of(tiny_tokenizer, turns[0].prompt_ids)
        j = state["in_flight"][i]  # at the boundary every slot has an episode in flight: its round is played again
        assert j == state["episodes_started"][i] - 1
        assert t == 0 and seed == 2 * j + (i + j) % 2  # that episode, from its start
    assert again.counters.turns == state["counters"]["turns"] + 6
    # an older checkpoint, without in_flight: the slots go on with their next seeds
    older, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    older.load_state_dict({k: v for k, v in state.items() if k != "in_flight"})
    [batch] = await collect_batches(older, 1)
    for i, turns in enumerate(batch.turns):
        seed, t = state_of(tiny_tokenizer, turns[0].prompt_ids)
        j = state["episodes_started"][i]
        assert t == 0 and seed == 2 * j + (i + j) % 2


async def test_a_graph_that_always_fails_stops_the_run(tiny_tokenizer):
    runner, _ = make_runner(
        tiny_tokenizer, num_envs=2, turns_per_env=2, max_consecutive_failures=3, fail_seeds=set(range(1000))
    )
    with pytest.raises(SlotFailureError, match="3 episodes in a row"):
        await collect_batches(runner, 1)


async def test_seed_dependent_failures_are_spread_over_the_slots(tiny_tokenizer):
    # every seed divisible by 3 fails: with seeds pinned to slots (slot i: seeds = i mod 3) slot 0
    # would fail every episode and stop the run; rotated, no slot fails twice in a row
    runner, _ = make_runner(
        tiny_tokenizer,
        num_envs=3,
        turns_per_env=4,
        max_consecutive_failures=2,
        fail_seeds={s for s in range(1000) if s % 3 == 0},
    )
    batches = await collect_batches(runner, 6)
    failed = [e for batch in batches for e in batch.failed]
    assert failed and runner.counters.failed == {"error": len(failed)}


async def test_make_input_missing_stops_at_once(tiny_tokenizer):
    runner, _ = make_runner(tiny_tokenizer)

    def no_input(seed):
        raise GraphFileError("graphs/x.py defines no make_input(seed)")

    runner.make_input = no_input
    with pytest.raises(GraphFileError, match="make_input"):
        await asyncio.wait_for(collect_batches(runner, 1), 10)


@pytest.mark.parametrize("sync", [False, True], ids=["async-nodes", "sync-nodes"])
async def test_truncated_turns_carry_the_next_prompt(tiny_tokenizer, sync):
    # episodes are cut after 2 steps (those that would last longer): the env reports the prompt
    # the next call would have had, rendered exactly as the chat model renders a call
    runner, _ = make_runner(tiny_tokenizer, sync=sync, cap=2)
    batches = await collect_batches(runner, 2)
    truncated = [t for batch in batches for slot in batch.turns for t in slot if t.truncated]
    assert truncated
    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["go"]), tokenizer=tiny_tokenizer)
    for turn in truncated:
        seed, t = state_of(tiny_tokenizer, turn.prompt_ids)
        assert t == 1 and not turn.terminated
        assert turn.next_prompt_ids == model.render_prompt_ids(prompt(seed, t + 1))
    assert all(t.next_prompt_ids is None for b in batches for s in b.turns for t in s if not t.truncated)


async def test_async_graphs_play_on_the_runners_loop_and_threads_on_request(tiny_tokenizer):
    """``slot_threads="auto"``: async nodes run on the runner's own thread (no hop per call);
    ``"always"``: each slot's on a thread of its own from the start. Same batches either way."""
    seen = {}
    for mode in ("auto", "always"):
        threads: list = []
        runner, _ = make_runner(tiny_tokenizer, slot_threads=mode, threads=threads)
        batches = await collect_batches(runner, 2)
        names = {name for _, _, name in threads}
        if mode == "auto":
            assert names == {threading.current_thread().name} and runner.counters.moved == 0
        else:
            assert names and all(name.startswith("verlog-slot") for name in names)
        seen[mode] = [[state_of(tiny_tokenizer, t.prompt_ids) for t in turns] for b in batches for turns in b.turns]
    assert seen["auto"] == seen["always"]
    with pytest.raises(ValueError, match=r"slot_threads must be one of \['auto', 'always'\]"):
        make_runner(tiny_tokenizer, slot_threads="never")


async def test_a_blocking_call_on_the_runners_loop_moves_its_episode_to_a_thread(tiny_tokenizer):
    """An ``async def`` node calling ``model.invoke`` (turn 1, after an answered turn 0) on the
    runner's loop: the call is refused there, the episode is played again from its start on its
    slot's thread (its answered turn in this batch dropped, no failure counted), and every slot's
    later episodes run on threads; the batches keep their shape and their episodes' order."""
    threads: list = []
    runner, _ = make_runner(tiny_tokenizer, block_turn=1, threads=threads)
    with pytest.warns(RuntimeWarning, match="blocking model call .* played again"):
        batches = await collect_batches(runner, 3)
    assert runner.counters.failed == {} and not any(b.failed for b in batches)
    assert runner.counters.moved == 3 and runner.counters.moved_calls == 3  # each slot's first episode, at turn 1
    main = threading.current_thread().name
    for slot in range(3):  # each slot's first seed: turns 0 and 1 on the runner's loop, then again on its thread
        first = [(t, name) for seed, t, name in threads if seed == slot_of_first(slot)]
        assert first[:4] == [(0, main), (1, main), (0, f"verlog-slot{slot}"), (1, f"verlog-slot{slot}")]
    later = [name for seed, t, name in threads if seed >= 3]
    assert later and all(name.startswith("verlog-slot") for name in later)
    for b, batch in enumerate(batches):
        assert batch.num_envs == 3 and all(len(turns) == 4 for turns in batch.turns)
        for i, turns in enumerate(batch.turns):
            states = [state_of(tiny_tokenizer, t.prompt_ids) for t in turns]
            assert all(slot_of(seed) == i for seed, _ in states)
            if b == 0:  # the replayed episode from its start: the moved one's turn 0 was dropped
                assert states[0] == (slot_of_first(i), 0) and states[1] == (slot_of_first(i), 1)
            for (s0, t0), (s1, t1) in zip(states, states[1:]):
                assert (s1, t1) == (s0, t0 + 1) or (t1 == 0 and s1 == next_seed(s0))
