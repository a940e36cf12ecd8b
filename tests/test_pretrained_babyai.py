"""``benchmarks/pretrained_babyai.py``: the recipe for a pretrained model on BabyAI is what its docs
say, and the benchmark's plumbing (training with before/after evaluations, random valid actions on the
same levels, the result file with the seconds of each phase) runs end to end for one tiny update."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from verlog.config import load_config
from verlog.evaluation.results import difference
from verlog.graph_file import import_python_file


def _bench():
    return import_python_file(ROOT / "benchmarks" / "pretrained_babyai.py", what="benchmark")


def test_the_recipe_is_smollm2_on_balrogs_go_to_with_ppo_and_a_critic():
    config = load_config(_bench().CONFIG)
    kwargs = config.multi_turn.langgraph.graph_kwargs
    assert config.model.path == "smollm2" and config.multi_turn.langgraph.path.endswith("graphs/babyai.py")
    assert kwargs["task"] == "goto" and kwargs["protocol"] == "balrog" and kwargs["constrain_answers"] is True
    assert config.algorithm.estimator == "gae" and config.critic_warmup.buffer_multiplier > 0
    assert config.algorithm.constrained_logprobs == "masked"  # constrained turns train on the masked distribution
    assert config.eval.episodes >= 128 and config.eval.at_start and config.eval.at_end
    assert config.actor.train_layers == config.critic.train_layers  # one frozen trunk, run once per batch


def test_difference_in_standard_errors():
    assert difference((0.5, 0.03), (0.2, 0.04)) == pytest.approx((0.3, 0.05, 6.0))
    assert difference((1.0, 0.0), (0.0, 0.0))[2] == float("inf")
    assert difference((0.3, 0.0), (0.3, 0.0))[2] == 0.0


@pytest.mark.timeout(600)
def test_one_tiny_update_writes_the_result_with_its_profile(tmp_path, capsys):
    bench = _bench()
    small = [
        "model.path=tiny",
        "model.device=cpu",
        "trainer.num_envs=4",
        "trainer.turns_per_env=3",
        "multi_turn.langgraph.graph_kwargs.max_steps=5",
        "eval.episodes=2",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "algorithm.mini_batch_turns=6",
        "trainer.torch_threads=1",
        "actor.train_layers=1",
        "critic.train_layers=1",
    ]
    results = tmp_path / "results"
    assert (
        bench.main(
            ["run", "--updates", "1", "--out", str(tmp_path / "runs"), "--results", str(results), "--set", *small]
        )
        == 0
    )
    result = json.loads((results / "result.json").read_text())
    assert result["updates"] == 1 and result["batch_turns"] == 12
    for player in ("before", "after", "random"):
        assert result[player]["episodes"] == 2 and 0 <= result[player]["win_rate"] <= 1
    profile = result["seconds_per_update"]
    assert all(profile[key] > 0 for key in ("rollout_s", "trunk_s", "logprob_s", "value_s", "actor_s", "critic_s"))
    assert profile["update_s"] >= sum(
        profile[key] for key in ("trunk_s", "logprob_s", "value_s", "actor_s", "critic_s")
    )
    assert 0 < result["training_wall_s"] <= result["wall_s"] and result["load"]["samples"] >= 1
    said = capsys.readouterr().out
    assert "| random valid actions |" in said and "seconds per update:" in said
    assert bench.main(["show", "--results", str(results)]) == 0
    assert bench.main(["show", "--results", str(tmp_path / "none")]) == 2
