"""Reward functions outside the graph: loaded by ``file.py:name``, called with the arguments they
name, weighted and combined, and failing the episode (never scoring it 0) when they go wrong."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from verlog.config import ConfigError, RewardConfig, RewardFunctionConfig
from verlog.rewards import Outcome, RewardError, RewardFunction, RewardResult, RewardScorer, Trajectory
from verlog.rewards.result import as_result
from verlog.rollout import Episode, Turn

ROOT = Path(__file__).resolve().parents[1]

REWARDS = """
import asyncio, time
from verlog.rewards import RewardResult

def exact(completion, answer):
    return completion.strip() == answer

def by_columns(answer, kind, row, key):
    return {"reward": float(len(answer)), "info": {"kind": kind, "key": key, "row": row["answer"]}}

def everything(**kwargs):
    return len(kwargs["turns"]) + kwargs["scale"]

async def later(completion):
    await asyncio.sleep(0.01)
    return RewardResult(0.5, success=True, info={"said": completion})

def per_turn(turns):
    return {"reward": 0.0, "turn_rewards": [float(i) for i, _ in enumerate(turns)]}

def slow(completion):
    time.sleep(2)
    return 1.0

def broken(completion):
    raise KeyError("answer")

def nonsense(completion):
    return "yes"

def wrong_turns(turns):
    return {"reward": 1.0, "turn_rewards": [1.0]}

def needs(answer_text):
    return 1.0

def infinite(completion):
    return float("inf")

def _private():
    return 0
"""


@pytest.fixture
def reward_file(tmp_path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def fn(path: Path, name: str, **extra) -> RewardFunction:
    return RewardFunction(RewardFunctionConfig(function=f"{path}:{name}", **extra))


def trajectory(answer: str = "42", turns: int = 2, row: dict | None = None) -> Trajectory:
    messages = [HumanMessage("What is 6 * 7?"), AIMessage(answer)]
    recorded = [Turn("ep", i, [1, 2], [3], [-0.5]) for i in range(turns)]
    return Trajectory(
        state={"messages": messages},
        row=row or {"answer": "42", "kind": "multiply"},
        key=7,
        turns=recorded,
        info={"steps": 2},
        episode_id="ep",
    )


async def test_functions_get_the_arguments_they_name(reward_file):
    assert await fn(reward_file, "exact")(trajectory()) == RewardResult(1.0, success=True)
    assert (await fn(reward_file, "exact")(trajectory("41"))).reward == 0.0
    result = await fn(reward_file, "by_columns")(trajectory())
    assert result.reward == 2.0 and result.info == {"kind": "multiply", "key": 7, "row": "42"}
    assert (await fn(reward_file, "everything", kwargs={"scale": 10})(trajectory(turns=3))).reward == 13.0
    assert await fn(reward_file, "later")(trajectory()) == RewardResult(0.5, success=True, info={"said": "42"})
    assert (await fn(reward_file, "per_turn")(trajectory(turns=3))).turn_rewards == [0.0, 1.0, 2.0]


async def test_a_sync_function_runs_off_the_event_loop(reward_file):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    with pytest.raises(RewardError, match=r"reward function slow .* took longer than 0.3 s \(timeout_s\)"):
        await fn(reward_file, "slow", timeout_s=0.3)(trajectory())
    task.cancel()
    assert time.perf_counter() - started < 1.5 and ticks >= 10  # the loop kept running meanwhile


@pytest.mark.parametrize(
    "name, message",
    [
        ("broken", r"reward function broken \(.*:broken\) raised KeyError: 'answer'"),
        ("nonsense", r"returned str; return a real number, a bool, a dict with 'reward'.*verl's dict with 'score'"),
        ("wrong_turns", r"turn_rewards has 1 values for 2 recorded turns"),
        ("infinite", r"must be finite"),
    ],
)
async def test_a_failing_function_is_a_reward_error(reward_file, name, message):
    with pytest.raises(RewardError, match=message):
        await fn(reward_file, name)(trajectory())


def _value_types():
    import numpy as np
    import torch

    return [
        (np.float32(0.25), 0.25, None),
        (np.float64(-1.5), -1.5, None),
        (np.int64(3), 3.0, None),
        (np.bool_(True), 1.0, True),
        (np.bool_(False), 0.0, False),
        (np.array(0.5), 0.5, None),
        (torch.tensor(0.75), 0.75, None),
        (torch.tensor([2.0]), 2.0, None),
        (torch.tensor(True), 1.0, True),
        (Fraction(1, 4), 0.25, None),
        (True, 1.0, True),
        (7, 7.0, None),
        ({"score": np.float32(0.5), "acc": np.bool_(True), "pred": "42"}, 0.5, None),  # verl's dict
        ({"reward": torch.tensor(1.0), "success": np.bool_(True)}, 1.0, True),
    ]


@pytest.mark.parametrize("value, reward, success", _value_types())
def test_any_real_number_type_is_a_reward(value, reward, success):
    result = as_result(value, turns=0)
    assert result.reward == reward and type(result.reward) is float and result.success is success
    if isinstance(value, dict) and "score" in value:  # verl's other keys are kept, as plain Python values
        assert result.info == {"acc": True, "pred": "42"} and type(result.info["acc"]) is bool


@pytest.mark.parametrize(
    "value, message",
    [
        (float("nan"), "must be finite, got nan"),
        (np.float32("inf"), "must be finite, got inf"),
        ({"score": float("-inf")}, "the dict's 'score' must be finite"),
        ("1.0", "returned str"),
        ({"score": 1.0, "reward": 1.0}, r"unknown keys \['score'\]"),
        (np.array([1.0, 2.0]), "returned ndarray"),
    ],
)
def test_non_finite_and_non_numbers_are_refused_with_the_reason(value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        as_result(value, turns=0)


async def test_absurd_rewards_fail_the_episode_unless_clipped(reward_file, tmp_path):
    path = tmp_path / "huge.py"
    path.write_text(
        "import numpy as np\ndef huge(completion):\n    return np.float32(1e30)\n"
        "def per_turn(turns):\n    return {'reward': -5.0, 'turn_rewards': [1e7] * len(turns)}\n"
    )
    scorer = RewardScorer(RewardConfig(functions=[f"{path}:huge"]))
    with pytest.raises(
        RewardError,
        match=r"^huge: reward 1e\+30 is beyond reward.max_abs \(1e\+06\); scale the reward, "
        r"set reward.clip to clip it, or raise reward.max_abs$",
    ):
        await scorer.score(trajectory())
    with pytest.raises(RewardError, match=r"reward 1e\+07 is beyond"):  # turn rewards are bounded too
        await RewardScorer(RewardConfig(functions=[f"{path}:per_turn"])).score(trajectory())
    clipped = await RewardScorer(RewardConfig(functions=[f"{path}:huge", f"{path}:per_turn"], clip=2.0)).score(
        trajectory()
    )
    assert clipped.components == {"huge": 2.0, "per_turn": -2.0} and clipped.turn_rewards == [2.0, 2.0]
    unbounded = await RewardScorer(RewardConfig(functions=[f"{path}:huge"], max_abs=None)).score(trajectory())
    assert unbounded.reward == pytest.approx(1e30, rel=1e-6)
    with pytest.raises(ValueError, match="greater than 0"):
        RewardConfig(clip=0)


def test_loading_mistakes_name_the_key(reward_file, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"reward.functions: .*my_rewards.py has no function 'exactly' \(its functions: "
        r"broken, by_columns, everything, exact, infinite, later",
    ):
        fn(reward_file, "exactly")
    with pytest.raises(ConfigError, match=r"reward file .*nowhere.py' does not exist"):
        fn(tmp_path / "nowhere.py", "f")
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_package.rewards': No module named"):
        RewardFunction(RewardFunctionConfig(function="no_such_package.rewards:f"))
    with pytest.raises(ValueError, match="must be file.py:function"):
        RewardFunctionConfig(function="rewards.py")
    needs = fn(reward_file, "needs")
    needs.check_arguments(["answer_text"])  # a column provides it
    with pytest.raises(
        ConfigError,
        match=r"needs 'answer_text', which is neither an episode field \(state, messages, "
        r"completion.*\), a column of the rows \(answer, kind\)",
    ):
        needs.check_arguments(["answer", "kind"])


async def test_the_scorer_weights_and_combines(reward_file):
    config = RewardConfig(
        functions=[
            {"function": f"{reward_file}:exact", "weight": 1.0},
            {"function": f"{reward_file}:by_columns", "weight": 0.1, "name": "length"},
            {"function": f"{reward_file}:per_turn", "weight": 2.0},
        ]
    )
    scorer = RewardScorer(config)
    outcome = await scorer.score(trajectory())
    assert outcome.reward == pytest.approx(1.0 + 0.2)
    assert outcome.turn_rewards == [0.0, 2.0] and outcome.success is True
    assert outcome.components == {"exact": 1.0, "length": 2.0, "per_turn": 0.0}
    # onto an episode: the reward on the last turn, per-turn rewards on theirs, the verdict in its info
    turns = [Turn("ep", i, [1], [2], [-1.0], reward=0.5 * i) for i in range(2)]
    episode = Episode("ep", turns)
    outcome.apply(episode)
    assert [t.reward for t in turns] == [0.0, 0.5 + 2.0 + 1.2]
    assert episode.info["success"] is True and episode.info["reward/length"] == 2.0
    # a graph that reported failure keeps it: every verdict must hold
    turns = [Turn("ep", 0, [1], [2], [-1.0], info={"success": False})]
    Outcome(reward=1.0, success=True).apply(Episode("ep", turns))
    assert turns[0].info["success"] is False and turns[0].reward == 1.0
    # an endpoint's episode has no turns: the reward is the episode's own
    empty = Episode("ep", [])
    Outcome(reward=0.7).apply(empty)
    assert empty.total_reward == pytest.approx(0.7)


async def test_one_failing_component_fails_the_whole_outcome(reward_file):
    scorer = RewardScorer(RewardConfig(functions=[f"{reward_file}:exact", f"{reward_file}:broken"]))
    with pytest.raises(RewardError, match="broken"):
        await scorer.score(trajectory())


def test_the_shipped_calculator_reward_uses_math_verify():
    from verlog.rewards import load_function

    correct = load_function(f"{ROOT / 'rewards' / 'calculator.py'}:correct")
    assert correct(completion="Let me see: 68 * 7 = 476\nThe answer is 476.", answer="476") is True
    assert correct(completion="The answer is 475", answer="476") is False
    assert correct(completion="", answer="476") is False
    assert correct(completion="-28", answer="-28") is True
    assert correct(completion="answer: 4,042", answer="4042") is True
    # the reward a policy learned to game: restating the question states no result
    assert correct(completion="To calculate 91 * 38 using Python, you'll need to", answer="3458") is False
    assert correct(completion="The answer is (66 - 14) * 3", answer="156") is False
