"""``verlog train`` and ``verlog eval`` from the command line: a short run, its checkpoint
evaluated with mean ± standard error in JSON and a table, and the errors a user can make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verlog.cli import main
from verlog.config import load_config
from verlog.evaluation import TaskResult, mean_se

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "cue_corridor.yaml")


def short_run(run_dir: Path, *extra: str) -> list[str]:
    from verlog.models import toy_model_dir

    return [
        CONFIG,
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.total_updates=2",
        "trainer.num_envs=4",
        "trainer.turns_per_env=3",
        "trainer.save_every=1",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "eval.episodes=4",
        "algorithm.mini_batch_turns=6",
        *extra,
    ]


def test_train_then_eval_a_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", *short_run(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "after 2 updates" in out and "win rate" in out  # the final evaluation table
    after = json.loads((run_dir / "eval.json").read_text())["after"][0]
    assert after["task"] == "cue_corridor" and after["episodes"] == 4
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    update = [r for r in lines if r["kind"] == "update"][-1]
    for key in (
        "episode_return",
        "win_rate",
        "episode_length",
        "invalid_action_rate",
        "value_loss",
        "explained_variance",
        "approx_kl",
        "clip_frac",
        "entropy",
        "turns_per_s",
        "memory_peak_rss_gb",
    ):
        assert key in update, key

    result_file = tmp_path / "eval.json"
    assert (
        main(["eval", *short_run(run_dir), "--checkpoint", str(run_dir), "--episodes", "6", "--json", str(result_file)])
        == 0
    )
    out = capsys.readouterr().out
    assert "update_000002" in out and "±" in out
    data = json.loads(result_file.read_text())
    [task] = data["tasks"]
    assert task["episodes"] == 6 and 0 <= task["win_rate"] <= 1 and task["win_rate_se"] >= 0

    # the run folder is not overwritten by accident
    assert main(["train", *short_run(run_dir)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_bad_training_settings_are_named(tmp_path, capsys):
    assert main(["train", *short_run(tmp_path / "r", "algorithm.estimator=ppo")]) == 2
    assert "algorithm.estimator" in capsys.readouterr().err
    assert main(["train", *short_run(tmp_path / "r", "sampling.temperature=0")]) == 2
    assert "sampling.temperature" in capsys.readouterr().err
    assert main(["train", *short_run(tmp_path / "r", "trainer.num_envs=6", "trainer.group_size=4")]) == 2
    assert "group_size" in capsys.readouterr().err


def test_gpu_configs_load_with_verlog_settings():
    for name in ("babyai_gpu", "babaisai_gpu", "crafter_gpu"):
        config = load_config(ROOT / "configs" / f"{name}.yaml")
        assert config.actor.lr == 1e-6 and config.critic.lr == 1e-5
        assert config.algorithm.dual_clip == 3.0 and config.algorithm.first_value_weight == 3.0
        assert config.critic_warmup.buffer_multiplier == 40 and config.critic_warmup.iterations == 5


def test_mean_and_standard_error():
    # BALROG's standard error: the standard deviation with divisor n, over sqrt(n)
    assert mean_se([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, 0.5 / 2))
    assert mean_se([0.7]) == (0.7, 0.0)
    r = TaskResult("t", 3, 1, *mean_se([1, 0, 0]), *mean_se([1.0, 0.0, -0.1]), 5.0)
    assert r.as_dict()["win_rate"] == pytest.approx(1 / 3)


def test_lora_actor_trains_adapters_only_and_evaluates(tmp_path, capsys):
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    run_dir = tmp_path / "lora"
    assert (
        main(
            [
                "train",
                *short_run(
                    run_dir, "actor.lora.rank=4", "actor.lr=1e-2", "trainer.total_updates=1", "eval.at_end=false"
                ),
            ]
        )
        == 0
    )
    checkpoint = run_dir / "checkpoints" / "update_000001"
    adapters = load_file(checkpoint / "actor_adapter" / "adapter_model.safetensors")
    assert adapters and all("lora_" in name for name in adapters)
    assert not (checkpoint / "actor").exists()  # the base weights did not change: only adapters are saved
    assert any(t.abs().sum() > 0 for name, t in adapters.items() if "lora_B" in name)  # they were trained
    assert (
        main(
            [
                "eval",
                *short_run(run_dir),
                "--checkpoint",
                str(checkpoint),
                "--episodes",
                "2",
                "--json",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "e.json").read_text())["tasks"][0]["episodes"] == 2


def test_grpo_trains_without_a_critic(tmp_path):
    run_dir = tmp_path / "grpo"
    assert (
        main(
            [
                "train",
                *short_run(
                    run_dir,
                    "algorithm.estimator=grpo",
                    "trainer.group_size=2",
                    "trainer.total_updates=1",
                    "eval.at_start=false",
                    "eval.at_end=false",
                    "multi_turn.langgraph.graph_kwargs.max_turns=2",
                ),
            ]
        )
        == 0
    )
    checkpoint = run_dir / "checkpoints" / "update_000001"
    assert (checkpoint / "actor" / "model.safetensors").is_file() and not (checkpoint / "critic.safetensors").exists()
    [update] = [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "update"
    ]
    assert "policy_loss" in update and "value_loss" not in update and 0 < update["policy_token_frac"] <= 1
    # whole groups: the rows' groups were compared, every play of each begun and ended in the batch
    assert update["groups_compared"] >= 1 and update["groups_dropped"] + update["groups_compared"] >= 2
