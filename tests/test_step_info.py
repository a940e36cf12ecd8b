"""The step-info contract every game's ``step`` returns, and the one rule for "was it won" that
training's win rate, evaluation and BALROG's progression share."""

from __future__ import annotations

import pytest

from verlog.envs import episode_won, list_envs, make_env
from verlog.envs.registry import progression
from verlog.evaluation.runner import episode_progression
from verlog.rollout.slots import SlotBatch
from verlog.rollout.turn import Episode, Turn
from verlog.step_info import ANCHOR_KEY, SUCCESS_KEY, episode_outcome, step_info
from verlog.train.metrics import rollout_metrics


def _episode(info: dict) -> Episode:
    turn = Turn(
        episode_id="e", turn_index=0, prompt_ids=[1], response_ids=[2], logprobs=[0.0], terminated=True, info=dict(info)
    )
    return Episode(episode_id="e", turns=[turn])


def test_the_outcome_rule() -> None:
    assert episode_outcome({"success": True, "won": False}) is True  # success decides when reported
    assert episode_outcome({"won": True}) is True  # a game that reports only its own verdict
    assert episode_outcome({"success": None, "won": False}) is False
    assert episode_outcome({"valid_action": True}) is None and not episode_won({})
    assert step_info("go", True, 3, done=False, success=True) == {"action": "go", "valid_action": True, "step": 3}
    assert step_info("go", False, 4, done=True, success=False, won=False)[SUCCESS_KEY] is False
    assert ANCHOR_KEY == "anchor"


def test_training_and_evaluation_count_the_same_wins() -> None:
    episodes = [_episode({"success": True}), _episode({"won": True}), _episode({"won": False}), _episode({"step": 9})]
    batch = SlotBatch(
        turns=[[t for e in episodes for t in e.turns]],
        bootstrap_prompt_ids=[[]],
        starts_episode=[True],
        seeds=[[0, 1, 2, 3]],
        episodes=episodes,
    )
    # three episodes say how they ended (two won); the fourth does not and is not counted
    assert rollout_metrics(batch)["win_rate"] == pytest.approx(2 / 3)
    assert [episode_won(e.info) for e in episodes] == [True, True, False, False]
    # evaluation's progression of a game without its own: 100 for a won episode
    assert episode_progression("my-graph", {"won": True}, success=True) == 100.0
    assert progression("babaisai:goto_win", {"won": True}) == 1.0  # BALROG's, through the same rule


@pytest.mark.parametrize("name", ["babyai:goto", "babaisai:goto_win", "crafter", "minihack:MazeWalk-9x9", "sokoban"])
def test_every_step_reports_the_contract(name: str) -> None:
    assert name in list_envs()
    env = make_env(name, seed=0, max_steps=3)
    env.reset()
    steps = [env.step(f"ACTION: {env.valid_actions()[0]}") for _ in range(3)]
    for k, result in enumerate(steps, 1):
        assert {"action", "valid_action", "step"} <= set(result.info) and result.info["step"] == k
        assert isinstance(result.info["valid_action"], bool) and 0.0 <= result.info["progression"] <= 1.0
        assert (SUCCESS_KEY in result.info) == result.done  # reported once the episode has ended
    assert steps[-1].done and episode_outcome(steps[-1].info) is not None
