"""Every registered estimator and loss option trains through ``verlog train`` (one short update on
the cue corridor): a critic exactly when the estimator needs one, their metrics logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_cli import short_run

from verlog.algo.estimators import get_estimator
from verlog.cli import main

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    # rollout seed 3: its groups' returns are not all tied (tied groups are dropped: no policy loss at all)
    "gigpo": [
        "algorithm.estimator=gigpo",
        "trainer.group_size=2",
        "algorithm.drop_uniform_groups=true",
        "rollout.seed=3",
    ],
    "rloo": [
        "algorithm.estimator=rloo",
        "trainer.group_size=2",
        "algorithm.policy_loss=gspo",
        "algorithm.clip_eps=0.0003",
        "algorithm.clip_eps_high=0.0004",
        "algorithm.dual_clip=null",
        "algorithm.loss_aggregation=sequence_mean",
    ],
    "reinforce_pp": ["algorithm.estimator=reinforce_pp", "algorithm.clip_eps_high=0.28", "algorithm.kl_coef=0.001"],
    "reinforce_pp_baseline": ["algorithm.estimator=reinforce_pp_baseline", "trainer.group_size=2", "rollout.seed=1"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_estimator_trains_through_the_trainer(tmp_path, name):
    run_dir = tmp_path / name
    assert (
        main(
            [
                "train",
                *short_run(
                    run_dir,
                    *CASES[name],
                    "trainer.total_updates=1",
                    "eval.at_start=false",
                    "eval.at_end=false",
                    "multi_turn.langgraph.graph_kwargs.max_turns=2",
                ),
            ]
        )
        == 0
    )
    critic = (run_dir / "checkpoints" / "update_000001" / "critic.safetensors").exists()
    assert critic == get_estimator(name).needs_critic
    [update] = [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "update"
    ]
    assert "policy_loss" in update and "value_loss" not in update and 0 <= update["policy_token_frac"] <= 1
    if name == "gigpo":
        assert "step_group_frac" in update and "dropped_group_frac" in update


def test_dynamic_sampling_needs_groups(tmp_path, capsys):
    assert main(["train", *short_run(tmp_path / "r", "algorithm.drop_uniform_groups=true")]) == 2
    assert "algorithm.drop_uniform_groups" in capsys.readouterr().err


def test_gigpo_on_a_graph_without_anchor_states_is_one_error_line(tmp_path, capsys):
    """A graph whose environment reports no info['anchor'] (the sync corridor) under GiGPO: one
    ``error:`` line naming the key and what the graph must report, exit 2, no traceback."""
    graph = ROOT / "tests" / "graphs" / "sync_corridor.py"
    args = short_run(
        tmp_path / "r",
        f"multi_turn.langgraph.path={graph}",
        "multi_turn.langgraph.graph_kwargs.max_turns=2",
        "algorithm.estimator=gigpo",
        "trainer.group_size=2",
        "trainer.turns_per_env=4",
        "algorithm.mini_batch_turns=8",
        "eval.at_start=false",
    )
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: algorithm.estimator: 'gigpo'") and "info['anchor']" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("name", ["gigpo", "grpo", "rloo"])
def test_a_batch_without_a_whole_group_says_so_in_the_update_line_for_every_group_estimator(tmp_path, capsys, name):
    """One turn per slot: no episode of the cue corridor ends in the batch, so no group is whole
    and nothing trains the policy; each group estimator says so on the update's line (GiGPO
    does not take the empty batch for a graph without anchor states)."""
    args = short_run(
        tmp_path / name,
        f"algorithm.estimator={name}",
        "trainer.group_size=2",
        "trainer.turns_per_env=1",
        "algorithm.mini_batch_turns=4",
        "trainer.total_updates=1",
        "eval.at_start=false",
        "eval.at_end=false",
    )
    assert main(["train", *args]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "update 1/1" in x]
    assert "policy not trained: no complete episode in this batch, hence no whole group to compare" in line
