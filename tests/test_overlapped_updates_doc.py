"""docs/overlapped_updates.md as a user runs it: its config blocks are valid ``trainer`` sections, its
``verlog train`` commands run as written (a tiny model and short runs appended as overrides), and
its benchmark commands build their tables (slow: short runs)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT
from doc_pages import doc_blocks, doc_commands

from verlog.cli import main
from verlog.config import TrainerConfig

PAGE = "overlapped_updates.md"
SHORT = [
    "trainer.total_updates=2",
    "trainer.num_envs=4",
    "trainer.turns_per_env=3",
    "critic_warmup.buffer_multiplier=1",
    "critic_warmup.iterations=1",
    "algorithm.mini_batch_turns=6",
    "eval.episodes=2",
    "multi_turn.langgraph.graph_kwargs.max_delay_s=0.2",
]


def test_the_pages_config_blocks_are_trainer_sections():
    blocks = [yaml.safe_load(block) for block in doc_blocks(PAGE, "yaml")]
    assert [sorted(b["trainer"]) for b in blocks] == [["overlap"], ["stragglers"]]
    overlap = TrainerConfig(**blocks[0]["trainer"]).overlap
    assert overlap.enabled and overlap.max_staleness == 1 and overlap.behaviour_weight_cap == 2.0
    stragglers = TrainerConfig(**blocks[1]["trainer"], turns_per_env=8).stragglers
    assert stragglers.enabled and stragglers.max_turns_per_env == 16


def test_the_pages_verlog_commands_run_as_written(tmp_path, tiny_dir, monkeypatch):
    commands = [line.split() for line in doc_commands(PAGE) if line.startswith("verlog ")]
    assert [c[1] for c in commands] == ["train", "train"]
    for name in ("configs", "graphs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        short = [f"model.path={tiny_dir}", "wandb.mode=disabled", *SHORT]
        if "slow_tool_corridor" not in " ".join(command):
            short = short[:-1]  # (the quick start's graph has no tool delay)
        assert main([*command[1:3], *short, *command[3:]]) == 0, " ".join(command)
    for run in ("quickstart_overlap", "slow_tools"):
        lines = (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()
        updates = [r for r in map(json.loads, lines) if r["kind"] == "update"]
        assert len(updates) == 2 and all("staleness_max" in r for r in updates)


@pytest.mark.slow
def test_the_pages_benchmark_commands_build_their_tables(tmp_path):
    """The benchmarks' commands, each run short (a tiny model, few updates, a few episodes)."""
    import subprocess
    import sys

    commands = [line.split() for line in doc_commands(PAGE) if line.startswith("python benchmarks/")]
    assert [c[1].split("/")[1] for c in commands] == ["overlap.py"] * 4 + ["slow_tools.py"] * 3
    short = ["trainer.total_updates=1", "trainer.num_envs=4", "trainer.turns_per_env=2", "eval.episodes=2"]
    short += ["critic_warmup.buffer_multiplier=1", "critic_warmup.iterations=1", "algorithm.mini_batch_turns=4"]
    for command in commands:
        args = [sys.executable, *command[1:], "--results", str(tmp_path / command[1].split("/")[1])]
        if command[2] == "run":
            overrides = list(short)
            if "crafter" in command:  # its budget: one batch after the warm-up
                args[args.index("--steps") + 1] = "16"
                overrides.append("multi_turn.langgraph.graph_kwargs.max_steps=8")
            if "slow_tools.py" in command[1]:
                overrides.append("multi_turn.langgraph.graph_kwargs.max_delay_s=0.2")
            args += ["--out", str(tmp_path / "runs"), "--set", *overrides]
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, " ".join(command) + "\n" + done.stdout[-2000:] + done.stderr[-2000:]
    assert "| quickstart | 0 |" in (tmp_path / "overlap.py" / "table.md").read_text()
    assert "stragglers / plain" in (tmp_path / "slow_tools.py" / "table.md").read_text()
