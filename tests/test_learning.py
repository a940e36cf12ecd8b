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
    return load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [f"trainer.run_dir={run_dir}", "wandb.mode=disabled", *overrides],
    )


#: the most updates the test's run may take. It usually stops early, but how many updates it needs
#: varies from run to run (25, 45 and more than 60 in three runs on one commit): the batches' episodes
#: depend on which of the concurrent episodes the engine answers first, so a busy machine changes the
#: path, not the destination. A cap of 60 made the test fail on a busy CI machine at 0.86.
MAX_UPDATES = 120


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """PPO on the corridor, stopped early once a validation evaluation reaches 0.95."""
    run_dir = tmp_path_factory.mktemp("ppo")
    config = corridor_config(
        run_dir, "trainer.eval_every=5", "trainer.stop_at_win_rate=0.95", f"trainer.total_updates={MAX_UPDATES}"
    )
    return train(config, console=Console(quiet=True))


@pytest.mark.slow  # 2-5 minutes on 2 cores: `make test-slow`
@pytest.mark.timeout(1500)  # generous for shared machines
def test_ppo_learns_the_cue_corridor(learned):
    before, after = learned.eval_start[0], learned.eval_end[0]
    print(
        f"\ncue corridor, {learned.updates} updates in {learned.seconds:.0f} s: "
        f"success {before.win_rate:.3f} -> {after.win_rate:.3f} ± {after.win_rate_se:.3f} "
        f"({after.episodes} held-out episodes)"
    )
    assert before.win_rate <= 0.05  # chance: a random policy practically never reaches the end
    assert after.win_rate >= 0.9  # on test seeds that the early stop never saw


@pytest.mark.slow
@pytest.mark.timeout(1500)  # as many updates as the learning run took
def test_zero_advantages_do_not_learn(learned, tmp_path):
    control = train(
        corridor_config(
            tmp_path / "zero",
            "algorithm.estimator=zero",
            "eval.at_start=false",
            f"trainer.total_updates={learned.updates}",
        ),
        console=Console(quiet=True),
    )
    print(f"\nzero advantages, {control.updates} updates: success -> {control.eval_end[0].win_rate:.3f}")
    assert control.updates == learned.updates
    assert control.eval_end[0].win_rate <= 0.1
