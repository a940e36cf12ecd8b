"""A judge that reuses the policy model, in training: the judge's calls run on the very engine the
slots train on, yet none of them becomes a training turn or counts against a slot's quota, and
each judge's score reaches the answer turn it judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from verlog.backends.base import Engine, Generation, SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.cli import main
from verlog.config import RewardConfig
from verlog.llm import VerlogChatModel
from verlog.rewards import RewardScorer, Trajectory
from verlog.rollout.slots import SlotRunner

ROOT = Path(__file__).resolve().parents[1]
JUDGE = {"kind": "rubric", "embedded": "policy", "max_tokens": 64, "explanation_chars": 16, "weight": 2.0}


class CountingEngine(Engine):
    """The embedded engine, counting the calls that carry an episode id (graph calls) apart from
    those that carry none (the judge's: they run outside every episode)."""

    def __init__(self, engine: EmbeddedEngine):
        self.inner = engine
        self.eos_token_ids = engine.eos_token_ids
        self.constraint_kinds = engine.constraint_kinds
        self.episode_calls: list[str] = []
        self.other_calls = 0

    def stop_token_ids(self, sampling: SamplingParams) -> list[int]:
        return self.inner.stop_token_ids(sampling)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        if request_id is None:
            self.other_calls += 1
        else:
            self.episode_calls.append(request_id)
        return await self.inner.generate(prompt_ids, sampling, request_id=request_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


def one_call_graph(model):
    async def answer(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


@pytest.mark.timeout(300)
async def test_a_judge_on_the_policys_engine_never_makes_a_training_turn(tiny_model, tiny_tokenizer):
    engine = CountingEngine(EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0))
    policy = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=6)  # the trainer's own
    scorer = RewardScorer(RewardConfig(judges=[JUDGE]), chat_model_for=lambda name: policy)
    scored: dict[str, float] = {}

    async def on_episode_end(episode, seed):
        trajectory = Trajectory(state=episode.output, key=seed, turns=episode.turns, episode_id=episode.episode_id)
        outcome = await scorer.score(trajectory)
        scored[episode.episode_id] = outcome.components["judge_rubric"]
        outcome.apply(episode)

    def build(gated):
        return one_call_graph(VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer, max_tokens=6))

    runner = SlotRunner(
        engine,
        build,
        lambda seed: {"messages": [HumanMessage(f"question {seed}")]},
        num_envs=4,
        turns_per_env=3,
        on_episode_end=on_episode_end,
    )
    try:
        batches = [await runner.collect() for _ in range(2)]
    finally:
        await runner.aclose()
        await engine.aclose()
    turns = [t for b in batches for t in b.flat_turns()]
    episodes = [e for b in batches for e in b.episodes]
    assert len(turns) == 2 * 4 * 3 and all(t.node == "answer" for t in turns)  # only the graph's calls
    assert len({(t.episode_id, t.turn_index) for t in turns}) == len(turns)
    # every judge call ran on the engine, outside any episode: one verdict per finished episode
    assert engine.other_calls >= len(scored) >= len(episodes) > 0
    assert set(engine.episode_calls) >= {t.episode_id for t in turns}
    for episode in episodes:  # the judge's score (0..1, weight 2) is the answer turn's reward
        [answer] = episode.turns
        score = scored[episode.episode_id]
        assert 0.0 <= score <= 1.0 and answer.reward == pytest.approx(2.0 * score)
        assert answer.info["reward/judge_rubric"] == score


@pytest.mark.timeout(600)
def test_verlog_train_with_a_policy_judge(tmp_path):
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = {**JUDGE, "reference_column": "answer"}
    run_dir = tmp_path / "run"
    args = [
        f"data.train={train}",
        "data.validation=null",
        "data.test=null",
        "reward.functions=[]",
        f"reward.judges=[{json.dumps(judge)}]",
        f"trainer.run_dir={run_dir}",
        "trainer.total_updates=2",
        "trainer.num_envs=4",
        "trainer.group_size=2",
        "trainer.turns_per_env=4",
        "trainer.save_every=0",
        "trainer.torch_threads=1",
        "sampling.max_tokens=8",
        "eval.at_start=false",
        "eval.at_end=false",
        "wandb.mode=disabled",
        "algorithm.mini_batch_turns=16",
    ]
    assert main(["train", str(ROOT / "configs" / "calculator.yaml"), *args]) == 0
    updates = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [u for u in updates if u.get("kind", "update") == "update" and "episode_return" in u]
    assert [u["update"] for u in updates] == [1, 2]
    for u in updates:
        assert 0.0 <= u["reward/judge_rubric"] <= 1.0
        assert u["episode_return"] == pytest.approx(2.0 * u["reward/judge_rubric"], abs=1e-6)
        assert u["failed_episodes"] == 0


async def test_evaluation_counts_the_agents_calls_not_a_judges():
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from verlog.evaluation.runner import ScoreRecorder
    from verlog.rollout import NO_TRAIN_TAG, run_episode

    model = GenericFakeChatModel(messages=iter([AIMessage("42"), AIMessage("score: 9")]))
    judge = model.with_config(tags=[NO_TRAIN_TAG])

    async def answer(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def grade(state: MessagesState) -> dict:
        await judge.ainvoke(state["messages"])
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_node("grade", grade)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", "grade")
    graph.add_edge("grade", END)
    recorder = ScoreRecorder("ep")
    episode = await run_episode(graph.compile(), {"messages": [HumanMessage("6 * 7?")]}, recorder=recorder)
    assert not episode.failed and recorder.model_calls == 1


@pytest.fixture
def garbage_judge():
    """An OpenAI-compatible endpoint (the scripted one, on a loop of its own) answering garbage."""
    import asyncio
    import threading

    from scripted_endpoint import ScriptedChatServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ScriptedChatServer(default=lambda body: "Great job, 10/10!")
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.timeout(300)
def test_verlog_train_stops_at_the_judges_max_consecutive_failures(tmp_path, garbage_judge, capsys):
    """A judge endpoint answering garbage: training stops with one error line once its 3rd verdict
    in a row failed (the judge's own max_consecutive_failures), not when slots have failed their
    own limit of episodes; the judge was asked little more than 3 times (the verdicts under way
    when it stopped)."""
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = {
        "kind": "rubric",
        "endpoint": {"base_url": garbage_judge.base_url, "model": "judge-model"},
        "retries": 0,
        "cache": False,
        "max_consecutive_failures": 3,
    }
    args = [
        f"data.train={train}",
        "data.validation=null",
        "data.test=null",
        "reward.functions=[]",
        f"reward.judges=[{json.dumps(judge)}]",
        f"trainer.run_dir={tmp_path / 'run'}",
        "trainer.total_updates=2",
        "trainer.num_envs=2",
        "trainer.group_size=1",
        "trainer.turns_per_env=2",
        "trainer.torch_threads=1",
        "trainer.max_consecutive_failures=100",
        "sampling.max_tokens=4",
        "multi_turn.langgraph.graph_config={recursion_limit: 4}",
        "eval.at_start=false",
        "eval.at_end=false",
        "wandb.mode=disabled",
        "algorithm.mini_batch_turns=4",
        "algorithm.estimator=reinforce_pp",
    ]
    assert main(["train", str(ROOT / "configs" / "calculator.yaml"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: reward.judges[0] (judge_rubric): 3 verdicts in a row failed"), err
    assert len(err.splitlines()) == 1
    assert 3 <= len(garbage_judge.requests) <= 3 + 2  # the two slots' verdicts under way at most
