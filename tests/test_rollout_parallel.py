"""Any graph, part two: every model call is trained exactly once, whatever order parallel branches
start, finish or are held in, and no boundary can hang.

The graph is ``tests/graphs/any_call.py``: steps made of 1-3 model calls through every LangChain
entry point (``Send`` fan-outs, ``batch``/``abatch``, ``asyncio.gather``, a branch that calls late,
``stream``/``astream``, calls with callbacks of their own, structured output; sync and async),
after random delays. The engine is the witness: it answers each call with a text of its own
(``a<n>``) and remembers every answer, so the turns of all batches can be checked against every
call the engine answered: each training call in exactly one batch, none twice, none missing.
Between batches stands the "update": every slot is held while evaluation episodes share the
engine, and branches that call late meet a closed gate.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import random
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Annotated

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.rollout import SlotFailureError, areport_reward, run_episode, run_episodes
from verlog.rollout.slots import SlotBatch, SlotRunner
from verlog.testing import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
GRAPH = load_graph_file(ROOT / "tests" / "graphs" / "any_call.py")
ANY_CALL = GRAPH.module
EVAL_SEED = 10**6
TAG = re.compile(r"\ba(\d+)\b")


class Branches(TypedDict):
    """The state of the small graphs written in the tests below."""

    seed: int
    done: Annotated[list[int], operator.add]


class Witness:
    """The engine's script: a text of its own for every call (a structured call's arguments when
    its prompt ends with a forced tool call), and every (prompt, answer) it gave."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.count = itertools.count(1)
        self.lock = threading.Lock()
        self.answers: list[tuple[str, str]] = []

    def __call__(self, prompt_ids: list[int]) -> str:
        prompt = self.tokenizer.decode(prompt_ids)
        tag = f"a{next(self.count)}"
        with self.lock:
            self.answers.append((prompt, tag))
        return f'{{"answer": "{tag}"}}}}\n</tool_call>' if prompt.endswith('"arguments": ') else tag

    def training_tags(self) -> list[str]:
        """The answers to the slots' policy calls (not the evaluations', not the judge's)."""
        return [tag for prompt, tag in self.answers if "judge" not in prompt and not _seed_of(prompt) >= EVAL_SEED]


def _seed_of(prompt: str) -> int:
    return int(re.search(r"seed (\d+) step", prompt).group(1))


def tag_of(tokenizer, turn) -> str:
    return TAG.search(tokenizer.decode(turn.response_ids, skip_special_tokens=True)).group(0)


async def play(
    tokenizer,
    styles,
    seed: int,
    *,
    batches: int = 4,
    judge: bool = False,
    checkpointer: bool = False,
    max_delay: float = 0.01,
    slot_threads: str = "auto",
):
    """Collect ``batches`` batches of a random slot layout, an "update" with evaluation episodes
    after each; returns (batches, witness, runner)."""
    rng = random.Random(seed)
    witness = Witness(tokenizer)
    engine = ScriptedEngine(tokenizer, witness)
    kwargs = dict(styles=styles, max_delay=max_delay, judge=judge, checkpointer=checkpointer)
    group_size = rng.choice([1, 2])
    runner = SlotRunner(
        engine,
        lambda gated: GRAPH.build(VerlogChatModel(engine=gated, tokenizer=tokenizer), **kwargs),
        GRAPH.episode_input,
        num_envs=group_size * rng.randint(1, 2),
        turns_per_env=rng.randint(2, 6),
        group_size=group_size,
        graph_config={"recursion_limit": 200},
        seed=rng.randint(0, 50),
        timeout_s=60,
        slot_threads=slot_threads,
    )
    evaluation = GRAPH.build(VerlogChatModel(engine=engine, tokenizer=tokenizer), **kwargs)  # the raw engine
    collected: list[SlotBatch] = []
    try:
        for b in range(batches):
            collected.append(await asyncio.wait_for(runner.collect(), 30))
            inputs = [GRAPH.episode_input(EVAL_SEED + 10 * b + i) for i in range(2)]
            update = asyncio.sleep(rng.random() * 0.06)
            evaluated = await asyncio.wait_for(
                asyncio.gather(update, run_episodes(evaluation, inputs, graph_config={"recursion_limit": 200})), 30
            )
            assert all(e.status == "ok" for e in evaluated[1]), [e.error for e in evaluated[1]]
    finally:
        await runner.aclose()
    return collected, witness, runner


def check_each_call_once(tokenizer, batches: list[SlotBatch], witness: Witness, runner: SlotRunner) -> int:
    """Every call the engine answered for the slots is a turn of exactly one batch, but those of an
    episode moved off the runner's loop by a blocking call (played again from its start, on its
    slot's thread: ``counters.moved_calls``); returns how many."""
    tags = [tag_of(tokenizer, turn) for batch in batches for turn in batch.flat_turns()]
    duplicated = [t for t, n in Counter(tags).items() if n > 1]
    missing = set(witness.training_tags()) - set(tags)
    assert not duplicated, f"trained twice: {duplicated}"
    assert len(missing) == runner.counters.moved_calls, f"never trained: {sorted(missing)}"
    assert sorted(tags) == sorted(set(witness.training_tags()) - missing)
    for batch in batches:
        assert {len(turns) for turns in batch.turns} == {runner.turns_per_env} and batch.num_envs == runner.num_envs
        for slot_turns, slot_seeds in zip(batch.turns, batch.seeds):  # each turn carries its episode's seed
            assert [_seed_of(tokenizer.decode(t.prompt_ids)) for t in slot_turns] == slot_seeds
        assert all(e.uncaptured_calls == 0 for e in batch.episodes)
        assert not batch.failed, [e.error for e in batch.failed]
    return len(tags)


CASES = [
    ("send", ["send"]),
    ("send_sync", ["send_sync"]),
    ("batch", ["batch"]),
    ("abatch", ["abatch"]),
    ("gather", ["gather"]),
    ("late", ["late"]),
    ("late_sync", ["late_sync"]),
    ("blocking", list(ANY_CALL.BLOCKING)),
    ("mixed", list(ANY_CALL.STYLES)),
]


@pytest.mark.parametrize("seed,slot_threads", [(0, "auto"), (1, "auto"), (2, "always")], ids=["0", "1", "2-threads"])
@pytest.mark.parametrize("name,styles", CASES, ids=[c[0] for c in CASES])
async def test_parallel_calls_are_trained_once_each(tiny_tokenizer, name, styles, seed, slot_threads):
    """Episodes on the runner's loop (moved to threads by a blocking call), or on threads from the start."""
    batches, witness, runner = await play(
        tiny_tokenizer, styles, seed=1000 * seed + len(name), slot_threads=slot_threads
    )
    if slot_threads == "always":
        assert runner.counters.moved == 0
    assert check_each_call_once(tiny_tokenizer, batches, witness, runner) == 4 * runner.num_envs * runner.turns_per_env


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
async def test_parallel_calls_stress_many_seeds(tiny_tokenizer, seed):
    rng = random.Random(seed)
    styles = rng.sample(list(ANY_CALL.STYLES), rng.randint(1, 4))
    batches, witness, runner = await play(
        tiny_tokenizer,
        styles,
        seed=seed,
        batches=6,
        checkpointer=rng.random() < 0.3,
        max_delay=rng.choice([0.0, 0.005, 0.03]),
        slot_threads=rng.choice(["auto", "always"]),
    )
    check_each_call_once(tiny_tokenizer, batches, witness, runner)


async def test_parallel_branches_with_a_checkpointer(tiny_tokenizer):
    """Parallel branches in a graph compiled with a checkpointer (its threads kept across runs)."""
    batches, witness, runner = await play(tiny_tokenizer, ["late", "send_sync", "gather"], seed=7, checkpointer=True)
    check_each_call_once(tiny_tokenizer, batches, witness, runner)


async def test_streamed_and_own_callback_calls_are_captured(tiny_tokenizer):
    """``stream``/``astream`` calls and calls made with ``config={"callbacks": [...]}`` (which
    replaces the run's callbacks) are recorded and gated like any other: all captured."""
    styles = ["astream", "stream", "own_callbacks", "own_callbacks_sync"]
    batches, witness, runner = await play(tiny_tokenizer, styles, seed=3)
    check_each_call_once(tiny_tokenizer, batches, witness, runner)
    nodes = {t.node for b in batches for t in b.flat_turns()}
    assert nodes == set(styles)
    # under verlog rollout too: every call is a turn, none uncaptured
    witness = Witness(tiny_tokenizer)
    graph = GRAPH.build(
        VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, witness), tokenizer=tiny_tokenizer), styles=styles
    )
    episodes = await run_episodes(
        graph, [GRAPH.episode_input(s) for s in range(6)], graph_config={"recursion_limit": 100}
    )
    assert sum(len(e.turns) for e in episodes) == len(witness.answers) > 0
    assert all(e.status == "ok" and e.uncaptured_calls == 0 for e in episodes)


async def test_blocking_calls_in_async_nodes_are_captured_once_in_rollout(tiny_tokenizer):
    """``verlog rollout`` and ``verlog eval`` (``run_episodes`` on the raw engine): a sync call inside
    an ``async def`` node runs as in production, each call one turn."""
    witness = Witness(tiny_tokenizer)
    graph = GRAPH.build(
        VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, witness), tokenizer=tiny_tokenizer),
        styles=list(ANY_CALL.BLOCKING),
    )
    episodes = await run_episodes(
        graph, [GRAPH.episode_input(s) for s in range(6)], graph_config={"recursion_limit": 100}
    )
    assert all(e.status == "ok" and e.uncaptured_calls == 0 for e in episodes), [e.error for e in episodes]
    tags = [tag_of(tiny_tokenizer, t) for e in episodes for t in e.turns]
    assert sorted(tags) == sorted(tag for _, tag in witness.answers) and len(set(tags)) == len(tags) > 6
    assert {t.node for e in episodes for t in e.turns} == set(ANY_CALL.BLOCKING)


async def test_judge_calls_are_never_turns_and_their_score_reaches_the_answer(tiny_tokenizer):
    batches, witness, runner = await play(tiny_tokenizer, ["ainvoke", "invoke", "astream"], seed=11, judge=True)
    check_each_call_once(tiny_tokenizer, batches, witness, runner)  # the judge's answers are not among the turns
    # a judge call is never held at the boundary: no bootstrap prompt is the judge's
    assert not any("judge" in tiny_tokenizer.decode(p) for b in batches for p in b.bootstrap_prompt_ids)
    verdicts = {}  # the answer judged -> the judge's score of it
    for prompt, tag in witness.answers:
        if "judge" in prompt:
            verdicts[TAG.search(prompt).group(0)] = ANY_CALL.judge_score(tag)
    assert verdicts
    scored = 0
    for batch in batches:
        for turn in batch.flat_turns():
            seed, step, call = map(
                int, re.search(r"seed (\d+) step (\d+) call (\d+)", tiny_tokenizer.decode(turn.prompt_ids)).groups()
            )
            if call < ANY_CALL.calls_at(seed, step) - 1:
                assert turn.reward == 0.0  # not the step's answer
            elif tag_of(tiny_tokenizer, turn) in verdicts:  # the answer: the latest trained turn before the judge
                assert turn.reward == verdicts[tag_of(tiny_tokenizer, turn)]
                scored += 1
    assert scored > 0


async def test_a_slot_blocked_at_the_boundary_keeps_no_other_from_it(tiny_tokenizer):
    """``model.invoke`` inside an ``async def`` node blocks its slot's event loop while the call is
    held at the boundary (over the whole "update"); the other slots, whose episodes run on loops of
    their own, still reach the boundary, and every call is trained once."""
    witness = Witness(tiny_tokenizer)
    runner = SlotRunner(
        ScriptedEngine(tiny_tokenizer, witness),
        lambda gated: GRAPH.build(
            VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer),
            styles=["invoke_in_async", "ainvoke", "stream_in_async"],
            max_delay=0.02,
        ),
        GRAPH.episode_input,
        num_envs=4,
        turns_per_env=3,
        graph_config={"recursion_limit": 200},
    )
    try:
        batches = []
        for _ in range(3):
            batches.append(await asyncio.wait_for(runner.collect(), 30))
            await asyncio.sleep(0.05)  # the update: the held calls' threads stay blocked meanwhile
    finally:
        await runner.aclose()
    assert {t.node for b in batches for t in b.flat_turns()} == {"invoke_in_async", "ainvoke", "stream_in_async"}
    assert check_each_call_once(tiny_tokenizer, batches, witness, runner) == 3 * 4 * 3


async def test_closing_the_runner_stops_every_slot_thread(tiny_tokenizer):
    """``aclose`` cancels episodes blocked in held sync calls and ends the slots' threads."""
    before = {t.name for t in threading.enumerate()}
    runner = SlotRunner(
        ScriptedEngine(tiny_tokenizer, ["go"]),
        lambda gated: GRAPH.build(
            VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer), styles=list(ANY_CALL.BLOCKING)
        ),
        GRAPH.episode_input,
        num_envs=3,
        turns_per_env=2,
        graph_config={"recursion_limit": 200},
    )
    await asyncio.wait_for(runner.collect(), 30)  # every slot now holds a call, its thread blocked in it
    await asyncio.wait_for(runner.aclose(), 30)
    left = {t.name for t in threading.enumerate() if t.is_alive()} - before
    assert not [name for name in left if name.startswith("verlog-slot")], left


async def test_a_training_call_that_bypasses_the_gate_stops_the_run(tiny_tokenizer):
    """A graph whose calls reach another engine than the one it was given would leave them untrained."""
    other = ScriptedEngine(tiny_tokenizer, ["go"])
    runner = SlotRunner(
        ScriptedEngine(tiny_tokenizer, ["go"]),
        lambda gated: GRAPH.build(VerlogChatModel(engine=other, tokenizer=tiny_tokenizer), styles=["ainvoke"]),
        GRAPH.episode_input,
        num_envs=1,
        turns_per_env=2,
    )
    try:
        with pytest.raises(SlotFailureError, match="without passing the training gate"):
            await asyncio.wait_for(runner.collect(), 10)
    finally:
        await runner.aclose()


async def test_a_graph_that_never_calls_the_model_is_an_error_episode(tiny_tokenizer):
    g = StateGraph(Branches)
    g.add_node("noop", lambda s: {"done": [1]})
    g.add_edge(START, "noop")
    g.add_edge("noop", END)
    episode = await run_episode(g.compile(), {"seed": 0, "done": []})
    assert episode.status == "error" and "without calling the model" in episode.error


async def test_each_run_of_an_episode_gets_a_thread_of_its_own(tiny_tokenizer):
    """A graph with a persistent checkpointer played twice under the same episode id (as repeated
    evaluations play their seeds) starts afresh each time instead of continuing the first run."""
    graph = GRAPH.build(
        VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["go"]), tokenizer=tiny_tokenizer),
        styles=["ainvoke"],
        checkpointer=True,
    )
    first = await run_episode(graph, GRAPH.episode_input(5), episode_id="eval/5", graph_config={"recursion_limit": 50})
    again = await run_episode(graph, GRAPH.episode_input(5), episode_id="eval/5", graph_config={"recursion_limit": 50})
    assert first.status == again.status == "ok"
    assert len(first.turns) == len(again.turns) and first.total_reward == again.total_reward
    assert again.output["answers"] == first.output["answers"] and again.output["t"] == ANY_CALL.episode_length(5)
    threads = {t.config["configurable"]["thread_id"] for t in ANY_CALL.SAVER.list(None)}
    assert len({t for t in threads if t.startswith("eval/5#")}) == 2


async def test_a_reward_reported_after_its_turn_was_cut_is_counted_and_warned(tiny_tokenizer):
    """Two ``Send`` branches each call the model and report their own reward 0.1 s later: with a
    quota of one call the first is admitted and the second held, the batch is cut at once, and
    the first branch's reward arrives for a turn already trained: counted, with a warning."""

    def build(gated):
        model = VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer)

        async def branch(s: dict) -> dict:
            await model.ainvoke([HumanMessage(f"branch {s['i']}")])
            await asyncio.sleep(0.1)
            await areport_reward(1.0)
            return {"done": [s["i"]]}

        g = StateGraph(Branches)
        g.add_node("branch", branch)
        g.add_conditional_edges(START, lambda s: [Send("branch", {"i": i}) for i in range(2)], ["branch"])
        g.add_edge("branch", END)
        return g.compile()

    runner = SlotRunner(
        ScriptedEngine(tiny_tokenizer, ["go"]),
        build,
        lambda seed: {"seed": seed, "done": []},
        num_envs=1,
        turns_per_env=1,
    )
    try:
        with pytest.warns(RuntimeWarning, match="already given to a batch"):
            await asyncio.wait_for(runner.collect(), 10)
            await asyncio.sleep(0.3)  # the "update": the first branch reports its reward meanwhile
            await asyncio.wait_for(runner.collect(), 10)
    finally:
        await runner.aclose()
    assert runner.counters.late_rewards == 1
