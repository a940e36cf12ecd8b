"""docs/warm_start.md as a user runs it: the page's ``verlog`` commands as written (a tiny model and
short runs appended as overrides), and the benchmark's commands that build its table."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from doc_pages import doc_commands

from verlog.cli import main
from verlog.graph_file import import_python_file

#: short runs of the page's configs: a few demonstrations, one epoch, one PPO update, two evaluation episodes
SHORT = [
    "sft.demonstrations=[{source: scripted, agent: game, episodes: 4}]",
    "sft.epochs=1",
    "sft.batch_turns=8",
    "trainer.total_updates=1",
    "trainer.num_envs=2",
    "trainer.turns_per_env=2",
    "critic_warmup.iterations=1",
    "eval.episodes=2",
    "multi_turn.langgraph.graph_kwargs.max_steps=8",
]


def _page(prefix: str) -> list[list[str]]:
    return [line.split() for line in doc_commands("warm_start.md") if line.startswith(prefix)]


def test_the_pages_verlog_commands_run_as_written(tmp_path, tiny_dir, monkeypatch, capsys):
    """``verlog sft`` then ``verlog train --init-from`` then ``verlog eval --checkpoint``, as the page
    writes them, in a folder of the user's own (``runs/`` is made there)."""
    commands = _page("verlog ")
    assert [c[1] for c in commands] == ["sft", "train", "eval"]
    for name in ("configs", "graphs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        short = [f"model.path={tiny_dir}", "wandb.mode=disabled", *SHORT]
        args = [*command[1:3], *short, *command[3:]]
        if command[1] == "eval":
            args += ["--episodes", "2"]
        assert main(args) == 0, " ".join(command)
    sft_dir, ppo_dir = tmp_path / "runs" / "babyai_sft", tmp_path / "runs" / "babyai_warm_ppo"
    counts = next((sft_dir / "demonstrations").glob("*.counts.yaml")).read_text()
    assert "kept: 4" in counts  # the bot won its 4 levels; each one a demonstration
    assert (sft_dir / "eval.json").is_file() and (ppo_dir / "eval.json").is_file()
    started = json.loads((ppo_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert started["update"] == 1
    assert "init_from" in (ppo_dir / "config.yaml").read_text()


@pytest.mark.slow
def test_the_benchmarks_commands_build_the_pages_table(tmp_path, tiny_dir, capsys):
    """``run`` (SFT then PPO, resumable), ``baseline`` (random valid actions over 5 player seeds, the
    untrained policy) and ``show`` (the table, the curves) of benchmarks/warm_start.py."""
    bench = import_python_file(ROOT / "benchmarks" / "warm_start.py", what="benchmark")
    assert {c[2] for c in _page("python benchmarks/warm_start.py")} == {"run", "baseline", "show"}
    where = ["--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    short = ["--set", f"model.path={tiny_dir}", *SHORT]
    assert bench.main(["run", "goto", "--seed", "1", *where, *short]) == 0
    result = json.loads((tmp_path / "results" / "goto" / "seed1.json").read_text())
    assert result["sft"]["demonstrations"]["0_scripted"]["kept"] == 4
    assert result["sft"]["cpu_s"] > 0 and result["ppo"]["updates"] == 1
    assert set(result["ppo"]["after"]) == {"babyai"}
    assert bench.main(["baseline", "goto", "--random-only", "--results", str(tmp_path / "results"), *short]) == 0
    assert bench.main(["baseline", "goto", "--untrained-only", "--results", str(tmp_path / "results"), *short]) == 0
    base = json.loads((tmp_path / "results" / "goto" / "baseline.json").read_text())
    assert base["random"]["babyai"]["players"] == bench.RANDOM_SEEDS and "before" in base  # one file, both rows
    capsys.readouterr()
    assert bench.main(["show", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "| random valid actions |" in out and "| SFT + PPO |" in out and "1 training seed," in out
    assert (tmp_path / "results" / "curves.png").is_file()
