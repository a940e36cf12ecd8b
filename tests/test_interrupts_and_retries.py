"""Graphs written as in production train unchanged: a human-in-the-loop graph (``interrupt()``)
answered by a responder in training and reported ``interrupted`` without one; model calls of
attempts that raised (``RetryPolicy``, ``with_retry``, ``with_fallbacks``) left out of training;
a reward reported at a join of parallel branches given to the same turn on every run."""

from __future__ import annotations

import json
import operator
from collections import Counter
from pathlib import Path
from typing import Annotated

import pytest
import yaml
from doc_pages import doc_blocks
from typing_extensions import TypedDict

from verlog.cli import main
from verlog.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
FOLLOW_UP = ROOT / "graphs" / "follow_up.py"
RESPONDER = f"{ROOT / 'examples' / 'follow_up_user.py'}:ask"
RETRY_JOIN = ROOT / "tests" / "graphs" / "retry_join.py"


def write_config(
    tmp_path: Path, name: str, graph: Path, *, updates: int = 2, num_envs: int = 2, turns_per_env: int = 3, **langgraph
) -> tuple[Path, Path]:
    """A small training config of ``graph`` on the tiny model: its file and run folder."""
    run_dir = tmp_path / name
    config = {
        "model": {"path": "tiny", "device": "cpu"},
        "engine": {"kind": "embedded", "batch_wait_ms": 1.0},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "multi_turn": {"langgraph": {"path": str(graph), **langgraph}},
        "rollout": {"episode_timeout_s": 120, "seed": 0, "episodes": 4},
        "trainer": {
            "run_dir": str(run_dir),
            "total_updates": updates,
            "num_envs": num_envs,
            "turns_per_env": turns_per_env,
            "save_every": 0,
            "eval_every": 0,
            "torch_threads": 1,
            "max_consecutive_failures": 3,
        },
        "actor": {"lr": 1.0e-4},
        "critic": {"lr": 1.0e-3},
        "algorithm": {"mini_batch_turns": num_envs * turns_per_env, "kl_coef": 0.0, "ppo_epochs": 1},
        "critic_warmup": {"buffer_multiplier": 0},
        "eval": {"episodes": 2, "at_start": False, "at_end": False},
        "wandb": {"mode": "disabled"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, run_dir


def update_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind", "update") == "update" and "actor_grad_norm" in r]


def rollout_json(config: Path, tmp_path: Path, episodes: int, *extra: str) -> list[dict]:
    out = tmp_path / "rollout.json"
    assert main(["rollout", str(config), "--episodes", str(episodes), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


# ---------------------------------------------------------------------- human in the loop
class BranchState(TypedDict):
    i: int
    said: Annotated[list, operator.add]


@pytest.mark.timeout(300)
def test_follow_up_graph_trains_with_a_simulated_user(tmp_path):
    """The example responder answers every pause: each episode is the 3 answers of a conversation
    (the first and two follow-ups), all trained, none failed."""
    config, run_dir = write_config(tmp_path, "answered", FOLLOW_UP, on_interrupt=RESPONDER, turns_per_env=3)
    assert main(["train", str(config)]) == 0
    rows = update_rows(run_dir)
    assert [r["update"] for r in rows] == [1, 2]
    assert all(r["failed_episodes"] == 0 for r in rows)
    ended = [r for r in rows if r["episodes"] > 0]
    assert ended and all(r["episode_length"] == 3 for r in ended)  # the calls after each resume are turns


@pytest.mark.timeout(300)
def test_without_a_responder_episodes_are_interrupted_never_ok_nor_trained(tmp_path, capsys):
    config, run_dir = write_config(tmp_path, "unanswered", FOLLOW_UP)
    episodes = rollout_json(config, tmp_path, 3)
    assert [e["status"] for e in episodes] == ["interrupted"] * 3
    assert all("on_interrupt" in e["error"] and len(e["turns"]) == 1 for e in episodes)
    assert "interrupted" in capsys.readouterr().out

    out = tmp_path / "eval"
    assert main(["eval", str(config), "--episodes", "3", "--out", str(out), "--no-chart"]) == 2  # nothing scored
    captured = capsys.readouterr()
    assert "stopped at interrupt()" in captured.err and "interrupted" in captured.out  # its own column
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["interrupted"] * 3

    # training: every episode fails as interrupted, none gives a turn, the run stops saying so
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "interrupted" in err and "on_interrupt" in err
    assert not (run_dir / "metrics.jsonl").exists() or update_rows(run_dir) == []  # no update ran


@pytest.mark.timeout(300)
def test_interrupted_episodes_are_left_out_of_training_like_failed_ones(tmp_path):
    """Odd seeds pause at interrupt() (nobody answers), even seeds play 2 steps: training goes on
    with the finished episodes only, the paused ones counted as failed."""
    config, run_dir = write_config(
        tmp_path,
        "mixed",
        RETRY_JOIN,
        graph_kwargs={"style": "pause", "steps": 2},
        updates=3,
        num_envs=2,
        turns_per_env=4,
    )
    with pytest.warns(RuntimeWarning, match=r"stopped at interrupt\(\) and are not trained.*on_interrupt"):
        assert main(["train", str(config)]) == 0
    rows = update_rows(run_dir)
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert sum(r["failed_episodes"] for r in rows) > 0 and sum(r["episodes"] for r in rows) > 0
    assert all(r["episode_length"] == 2 for r in rows if r["episodes"])  # only the finished ones


def test_interrupted_episodes_are_counted_apart_and_not_scored():
    from verlog.evaluation.results import EpisodeRecord, TaskResult

    def record(i: int, status: str, success: bool) -> EpisodeRecord:
        return EpisodeRecord(f"e{i}", "env", "task", i, status, 1, float(success), success, 100.0 * success, 0.1)

    result = TaskResult.from_records(
        "env", "task", [record(0, "ok", True), record(1, "interrupted", False), record(2, "interrupted", False)]
    )
    assert (result.episodes, result.win_rate, result.interrupted, result.errors) == (1, 1.0, 2, 0)


def test_on_interrupt_is_checked_with_a_one_line_error_naming_the_key(tmp_path):
    config, _ = write_config(tmp_path, "bad", FOLLOW_UP, on_interrupt="follow_up_user")
    with pytest.raises(ConfigError, match=r"multi_turn\.langgraph\.on_interrupt.*file\.py:function"):
        load_config(config)
    config, _ = write_config(
        tmp_path, "missing", FOLLOW_UP, on_interrupt=f"{ROOT / 'examples' / 'follow_up_user.py'}:nope"
    )
    from verlog.rollout.interrupts import InterruptResponder

    with pytest.raises(ConfigError, match=r"multi_turn\.langgraph\.on_interrupt.*no function 'nope'.*ask"):
        InterruptResponder.from_config(load_config(config).multi_turn.langgraph)
    config, _ = write_config(tmp_path, "nofile", FOLLOW_UP, on_interrupt="users/nobody.py:ask")
    with pytest.raises(ConfigError, match=r"multi_turn\.langgraph\.on_interrupt: responder file .*nobody\.py"):
        InterruptResponder.from_config(load_config(config).multi_turn.langgraph)


async def test_a_responder_that_raises_fails_its_episode_saying_so():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from verlog.graph_file import load_graph_file
    from verlog.rollout import run_episode
    from verlog.rollout.interrupts import InterruptResponder

    def respond(value, state):
        raise KeyError("no question left")

    graph_file = load_graph_file(FOLLOW_UP)
    episode = await run_episode(
        graph_file.build(FakeListChatModel(responses=["an answer"])),
        graph_file.make_input(0),
        interrupts=InterruptResponder(respond),
    )
    assert episode.status == "error"
    assert "on_interrupt: respond raised KeyError" in episode.error and episode.trainable_turns() == []


async def test_a_graph_that_always_pauses_stops_after_max_resumes(tmp_path):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from verlog.graph_file import load_graph_file
    from verlog.rollout import run_episode
    from verlog.rollout.interrupts import InterruptResponder

    graph_file = load_graph_file(FOLLOW_UP)
    graph = graph_file.build(FakeListChatModel(responses=["an answer"]), max_follow_ups=1000)
    calls = []
    episode = await run_episode(
        graph,
        graph_file.make_input(0),
        interrupts=InterruptResponder(lambda value, state: calls.append(value) or "more?", 3),
    )
    assert episode.status == "interrupted" and episode.resumes == 3 and len(calls) == 3
    assert "max_resumes" in episode.error and episode.model_calls == 4


async def test_parallel_pauses_are_answered_each_by_interrupt_id():
    """Two Send branches pause at once: the responder is asked once per pause and each branch gets
    its own answer."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph.graph import START, StateGraph
    from langgraph.types import Send, interrupt

    from verlog.rollout import run_episode
    from verlog.rollout.interrupts import InterruptResponder

    model = FakeListChatModel(responses=["fine"])

    async def ask(state: BranchState) -> dict:
        answer = interrupt(f"branch {state['i']}?")
        await model.ainvoke(answer)
        return {"said": [answer]}

    builder = StateGraph(BranchState)
    builder.add_node("ask", ask)
    builder.add_conditional_edges(START, lambda s: [Send("ask", {"i": i, "said": []}) for i in range(2)], ["ask"])
    asked = []
    responder = InterruptResponder(lambda value, state: asked.append(value) or f"yes to {value}")
    episode = await run_episode(builder.compile(), {"i": -1, "said": []}, interrupts=responder)
    assert episode.status == "ok" and episode.resumes == 1
    assert sorted(asked) == ["branch 0?", "branch 1?"]
    assert sorted(episode.output["said"]) == ["yes to branch 0?", "yes to branch 1?"]


# ---------------------------------------------------------------------- attempts thrown away
@pytest.mark.timeout(300)
@pytest.mark.parametrize("keep", [False, True])
def test_retry_policy_graph_trains_without_the_discarded_calls(tmp_path, keep):
    """Each of the 2 steps makes a call whose node attempt then raises and a call in the retry: by
    default an episode trains 2 turns and counts 2 discarded calls; with train_discarded_calls 4."""
    config, run_dir = write_config(
        tmp_path,
        f"retry{keep}",
        RETRY_JOIN,
        train_discarded_calls=keep,
        graph_kwargs={"style": "retry_policy", "steps": 2},
        turns_per_env=4,
    )
    assert main(["train", str(config)]) == 0
    rows = update_rows(run_dir)
    assert [r["update"] for r in rows] == [1, 2]
    ended = [r for r in rows if r["episodes"] > 0]
    assert ended and all(r["failed_episodes"] == 0 for r in rows)
    assert all(r["episode_length"] == (4 if keep else 2) for r in ended)
    assert all(r["discarded_calls"] == 2 * r["episodes"] for r in ended)


@pytest.mark.parametrize(
    "style,calls,discarded",
    [
        ("retry_policy", 4, 2),
        ("with_retry", 4, 2),
        ("with_fallbacks", 4, 2),
        ("errored_call", 6, 0),  # 2 calls per step errored themselves: never turns, nothing to discard
    ],
)
def test_calls_of_failed_attempts_never_become_turns_in_rollout(tmp_path, style, calls, discarded):
    config, _ = write_config(tmp_path, style, RETRY_JOIN, graph_kwargs={"style": style, "steps": 2})
    episodes = rollout_json(config, tmp_path, 2)
    for episode in episodes:
        assert episode["status"] == "ok"
        assert (len(episode["turns"]), episode["model_calls"], episode["discarded_calls"]) == (2, calls, discarded)
        assert [t["reward"] for t in episode["turns"]] == [1.0, 1.0]  # each step's reward on its kept call


@pytest.mark.timeout(300)
def test_a_join_reward_lands_on_the_same_turn_over_20_runs(tmp_path, tiny_tokenizer):
    """Three parallel branches start and finish in random order; the join's reward always goes to
    the last branch in LangGraph's order (the last ``Send``, branch 2), whatever the timing."""
    config, _ = write_config(tmp_path, "join", RETRY_JOIN, graph_kwargs={"style": "join", "steps": 1, "branches": 3})
    episodes = rollout_json(config, tmp_path, 20, "rollout.concurrency=4")
    rewarded, branch2_start = Counter(), Counter()
    for episode in episodes:
        assert episode["status"] == "ok" and len(episode["turns"]) == 3
        branches = {t["turn_index"]: tiny_tokenizer.decode(t["prompt_ids"]).count("branch 2") for t in episode["turns"]}
        (index,) = [i for i, hit in branches.items() if hit]
        branch2_start[index] += 1
        (turn,) = [t for t in episode["turns"] if t["reward"]]
        rewarded[turn["turn_index"] == index] += 1
    assert rewarded == Counter({True: 20})
    assert len(branch2_start) > 1  # the branches did start in different orders (turns are in start order)


def test_the_doc_pages_commands_run_as_written(monkeypatch, capsys):
    """docs/interrupts_and_retries.md: with the responder 3-turn ok episodes, without it 1-turn
    interrupted ones."""
    import shlex

    (block,) = doc_blocks("interrupts_and_retries.md", "bash")
    answered, unanswered = [shlex.split(line) for line in block.strip().splitlines()]
    monkeypatch.chdir(ROOT)
    assert answered[0] == "verlog" and main(answered[1:]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == 2 and "3 turns" in out and "interrupted" not in out
    assert main(unanswered[1:]) == 0
    out = capsys.readouterr().out
    assert out.count(": interrupted") == 2 and "1 turns" in out and "nobody answers" in out


async def test_a_call_made_before_interrupt_in_the_same_node_is_discarded_not_trained_twice(tiny_tokenizer):
    """LangGraph runs the paused node again from its start on resume: the call it made before
    interrupt() the first time was thrown away (discarded), the one of the run that went on is the
    turn, and the reward reported after the pause goes to it."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from verlog.llm import VerlogChatModel
    from verlog.rollout import areport_reward, run_episode
    from verlog.rollout.interrupts import InterruptResponder
    from verlog.testing.scripted_engine import ScriptedEngine

    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["a draft"]), tokenizer=tiny_tokenizer)

    async def draft(state: BranchState) -> dict:
        await model.ainvoke([HumanMessage("draft")])
        answer = interrupt("approve?")
        await areport_reward(1.0)
        return {"said": [answer]}

    builder = StateGraph(BranchState)
    builder.add_node("draft", draft)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", END)
    episode = await run_episode(
        builder.compile(), {"i": 0, "said": []}, interrupts=InterruptResponder(lambda value, state: "approved")
    )
    assert episode.status == "ok" and episode.output["said"] == ["approved"]
    assert (episode.model_calls, len(episode.turns), episode.discarded_calls) == (2, 1, 1)
    assert episode.turns[0].reward == 1.0


async def test_a_branch_reporting_its_own_reward_gets_it_on_its_own_call(tiny_tokenizer):
    """Parallel branches each call the model and report their own reward in the same node, in a
    random order: each reward lands on the call of the branch that reported it (the reporting
    node's own turn), on every run."""
    import asyncio
    import random

    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    from verlog.llm import VerlogChatModel
    from verlog.rollout import areport_reward, run_episodes
    from verlog.testing.scripted_engine import ScriptedEngine

    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["ok"]), tokenizer=tiny_tokenizer)

    async def branch(state: BranchState) -> dict:
        await asyncio.sleep(random.random() * 0.01)
        await model.ainvoke([HumanMessage(f"branch {state['i']}")])
        await asyncio.sleep(random.random() * 0.01)
        await areport_reward(float(state["i"] + 1))
        return {"said": [state["i"]]}

    builder = StateGraph(BranchState)
    builder.add_node("branch", branch)
    builder.add_conditional_edges(START, lambda s: [Send("branch", {"i": i, "said": []}) for i in range(3)], ["branch"])
    builder.add_edge("branch", END)
    episodes = await run_episodes(builder.compile(), [{"i": -1, "said": []}] * 10, concurrency=5)
    for episode in episodes:
        assert episode.status == "ok" and len(episode.turns) == 3
        for turn in episode.turns:
            branch_of = int(tiny_tokenizer.decode(turn.prompt_ids).split("branch ")[1][0])
            assert turn.reward == branch_of + 1


@pytest.mark.timeout(300)
def test_a_join_graph_trains_with_every_join_reward_on_a_trained_turn(tmp_path):
    """verlog train on the join graph: each episode is 3 parallel calls and one join reward of 1;
    with 3 turns per slot every batch holds whole episodes and its mean turn reward is exactly 1/3
    (no reward lost to a batch boundary or given twice)."""
    config, run_dir = write_config(
        tmp_path, "join_train", RETRY_JOIN, turns_per_env=3, graph_kwargs={"style": "join", "steps": 1, "branches": 3}
    )
    assert main(["train", str(config)]) == 0
    rows = update_rows(run_dir)
    assert [r["update"] for r in rows] == [1, 2]
    assert all(r["failed_episodes"] == 0 and r["turn_reward"] == pytest.approx(1 / 3) for r in rows)


async def test_turn_numbers_stay_unique_when_a_discarded_call_was_already_trained(tiny_tokenizer):
    """A node attempt makes two calls and raises: with one turn per batch its first call is cut
    into a batch before the attempt raises (that turn stays trained), the second gives its place
    back, and the retry's calls follow. No (episode, turn index) names two turns across the
    batches, and each turn keeps the number it was trained under."""
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel
    from verlog.rollout.slots import SlotRunner
    from verlog.testing.scripted_engine import ScriptedEngine

    graph_file = load_graph_file(RETRY_JOIN)
    engine = ScriptedEngine(tiny_tokenizer, ["go"])
    runner = SlotRunner(
        engine,
        lambda gated: graph_file.build(
            VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer, max_tokens=2), style="retry_policy", calls=2
        ),
        graph_file.episode_input,
        num_envs=1,
        turns_per_env=1,
        graph_config={"recursion_limit": 50},
        seed=0,
    )
    cut = []  # each turn trained, with its number when its batch was cut
    try:
        for _ in range(10):
            cut += [(t, t.turn_index) for t in (await runner.collect()).flat_turns()]
    finally:
        await runner.aclose()
    trained = [(t.episode_id, t.turn_index) for t, _ in cut]
    assert len(set(trained)) == len(trained), trained
    assert all(t.turn_index == number for t, number in cut)  # never renumbered after it was trained
    first = trained[0][0]
    assert [i for e, i in trained if e == first][:2] == [0, 2]  # the discarded call 1 left its number
