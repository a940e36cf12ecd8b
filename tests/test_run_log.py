"""``verlog train`` into a log file (``nohup``, a scheduler's log, ``> log.txt``): no live progress
bar, but one plain line per update, evaluation and phase, each whole on its line and flushed as it
is written, so the file shows the run while it goes on; at a terminal, the progress bar as before."""

from __future__ import annotations

import io
import re

import pytest
from conftest import ROOT
from rich.console import Console

from verlog.config import load_config
from verlog.train import train


class _LogFile(io.StringIO):
    """A file that keeps what had been written at each flush (what a reader of the log saw)."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def _train(tmp_path, console: Console) -> None:
    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [
            f"trainer.run_dir={tmp_path / 'run'}",
            "wandb.mode=disabled",
            "trainer.total_updates=3",
            "trainer.num_envs=8",
            "trainer.turns_per_env=4",
            "eval.episodes=4",
            "eval.concurrency=4",
            "critic_warmup.buffer_multiplier=1",
            "critic_warmup.iterations=1",
            "algorithm.mini_batch_turns=32",
        ],
    )
    train(config, console=console)


@pytest.mark.timeout(600)
def test_a_log_file_gets_a_plain_flushed_line_per_update_and_evaluation(tmp_path):
    log = _LogFile()
    _train(tmp_path, Console(file=log, width=80))  # what rich makes of a redirected stdout: no terminal, 80 columns
    lines = log.getvalue().splitlines()
    updates = [line for line in lines if re.match(r"\[\d+:\d\d:\d\d\] update \d/3 ", line)]
    assert [line.split()[2] for line in updates] == ["1/3", "2/3", "3/3"]
    for line in updates:  # the headline figures, on one line however long (no wrapping at 80 columns)
        assert " v_loss " in line and " kl " in line and " turns/s " in line
    assert any(
        re.match(r"\[[\d:]+\] eval at update 0: cue_corridor win \S+ return \S+ .*\(4 episodes, 0 failed\)$", line)
        for line in lines
    )
    assert any(re.match(r"\[[\d:]+\] eval at update 3: cue_corridor win ", line) for line in lines)
    assert any(line.endswith("critic warm-up: collecting batch 1/1") for line in lines)
    assert not any(
        line.endswith((" rollout", " update")) for line in lines
    )  # per-update phases: the update line says it
    assert not re.search(r"training .*\d/3", log.getvalue())  # no progress bar drawn into the file
    # each update's line was flushed before the next update began
    for first, then in zip(updates, updates[1:]):
        assert any(first in seen and then not in seen for seen in log.flushed)


@pytest.mark.timeout(600)
def test_a_terminal_keeps_the_progress_bar(tmp_path):
    screen = io.StringIO()
    _train(tmp_path, Console(file=screen, force_terminal=True, width=200))
    text = screen.getvalue()
    assert re.search(r"training.*━+.*0/3", text) and re.search(r"update 3(\x1b\[0m)? v_loss", text)
    assert not re.search(r"\[\d+:\d\d:\d\d\] update", text)
