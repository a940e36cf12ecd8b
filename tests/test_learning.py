"""The CPU learning proof: verlog's full path learns a multi-turn task with a delayed reward.

A random-init word-level toy model plays ``graphs/cue_corridor.py`` (reward only at the end of
the corridor) through the LangGraph graph, the recorder, fixed-turn batches, critic pre-training
and PPO — ``verlog train`` itself. It goes from chance to >= 0.9 success on held-out seeds. The
same run with every advantage replaced by zero (``algorithm.estimator=zero``) learns nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from verlog.config import load_config
from verlog.train import train

ROOT = Path(__file__).resolve().parents[1]


def corridor_config(run_dir: Path, *overrides: str):
    from verlog.train.toy_model import toy_model_dir

    return load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [f"model.path={toy_model_dir()}", f"trainer.run_dir={run_dir}", "wandb.mode=disabled", *overrides],
    )


# Slow until its wall time on a quiet 2-core machine is measured: it overran the 300 s test
# timeout on a machine shared with other jobs (see the issue-4 note). Run: make test-slow.
@pytest.mark.slow
def test_ppo_learns_the_cue_corridor_and_zero_advantages_do_not(tmp_path):
    learned = train(corridor_config(tmp_path / "ppo"), console=Console(quiet=True))
    before, after = learned.eval_start[0], learned.eval_end[0]
    print(
        f"\ncue corridor, {learned.updates} updates in {learned.seconds:.0f} s: "
        f"success {before.win_rate:.3f} -> {after.win_rate:.3f} ± {after.win_rate_se:.3f} "
        f"({after.episodes} held-out episodes)"
    )
    assert before.win_rate <= 0.05  # chance: a random policy practically never reaches the end
    assert after.win_rate >= 0.9

    control = train(
        corridor_config(tmp_path / "zero", "algorithm.estimator=zero", "eval.at_start=false"),
        console=Console(quiet=True),
    )
    print(f"zero advantages: success -> {control.eval_end[0].win_rate:.3f}")
    assert control.updates == learned.updates
    assert control.eval_end[0].win_rate <= 0.1
