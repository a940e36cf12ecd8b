"""The quick start (``make run``): BALROG's BabyAI "go to" learned from scratch on a CPU, beside a
random-valid-action baseline played on the same held-out levels."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from verlog.config import load_config
from verlog.envs.babyai.env import ACTIONS
from verlog.evaluation.baseline import RandomActionChatModel, evaluate_random, game_actions, main
from verlog.evaluation.tasks import config_tasks
from verlog.train import train

ROOT = Path(__file__).resolve().parents[1]


def quickstart(run_dir: Path, *overrides: str):
    return load_config(
        ROOT / "configs" / "quickstart.yaml", [f"trainer.run_dir={run_dir}", "wandb.mode=disabled", *overrides]
    )


def margin(a, b) -> float:
    """How many standard errors of the difference ``a``'s win rate is above ``b``'s."""
    return (a.win_rate - b.win_rate) / math.hypot(a.win_rate_se, b.win_rate_se)


def test_random_player_answers_valid_actions_on_the_quickstart_levels(tmp_path):
    config = quickstart(tmp_path, "eval.episodes=4")
    (task,) = config_tasks(config)
    assert game_actions(task) == list(ACTIONS)
    (result,) = asyncio.run(evaluate_random(config))
    assert result.episodes == 4 and result.failed == 0
    # every answer was valid: the return is the wins alone (an invalid answer costs 0.1)
    assert result.return_mean == pytest.approx(result.win_rate)
    player = RandomActionChatModel(actions=list(ACTIONS), seed=1)
    assert {player.invoke("x").content for _ in range(60)} == set(ACTIONS)


def test_random_player_is_repeatable_whatever_the_order_episodes_call_in(tmp_path):
    """Each episode draws from its own seeded stream: the same games however many play at once
    (one at a time, or 16 interleaved, their calls reaching the player in another order)."""
    results = []
    for concurrency in (1, 16, 16):
        config = quickstart(tmp_path, "eval.episodes=16", f"eval.concurrency={concurrency}")
        (result,) = asyncio.run(evaluate_random(config, seed=3))
        results.append((result.win_rate, result.return_mean, result.length_mean))
    assert results[0] == results[1] == results[2]


def test_baseline_command_prints_beside_the_runs_evaluations(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config_text = (ROOT / "configs" / "quickstart.yaml").read_text().replace("episodes: 128", "episodes: 3")
    (run_dir / "config.yaml").write_text(config_text)
    row = {"task": "babyai", "episodes": 3, "failed": 0, "return_mean": 0.0, "return_se": 0.0, "length_mean": 9.0}
    (run_dir / "eval.json").write_text(
        json.dumps(
            {
                "updates": 2,
                "before": [{**row, "win_rate": 0.0, "win_rate_se": 0.0}],
                "after": [{**row, "win_rate": 1.0, "win_rate_se": 0.0}],
            }
        )
    )
    assert main([str(run_dir)], console=Console(width=120, force_terminal=False)) == 0
    out = capsys.readouterr().out
    assert "random valid actions" in out and "before training" in out and "after 2 updates" in out
    assert json.loads((run_dir / "baseline.json").read_text())["random_valid_actions"][0]["episodes"] == 3


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~10 minutes on a quiet 2-core machine; generous for shared ones
def test_quickstart_learns_goto_beyond_random_valid_actions(tmp_path):
    """The quick start with half the held-out levels (64): after training, the win rate is more
    than 3 standard errors above both the initial policy's and random valid actions'."""
    config = quickstart(tmp_path / "run", "eval.episodes=64")
    learned = train(config, console=Console(quiet=True))
    (before,), (after,) = learned.eval_start, learned.eval_end
    (rand,) = asyncio.run(evaluate_random(config))
    print(
        f"\nquick start, {learned.updates} updates in {learned.seconds:.0f} s, win rate on 64 held-out levels: "
        f"random valid actions {rand.win_rate:.2f}±{rand.win_rate_se:.2f}, "
        f"before {before.win_rate:.2f}±{before.win_rate_se:.2f}, after {after.win_rate:.2f}±{after.win_rate_se:.2f}"
    )
    assert before.episodes == after.episodes == rand.episodes == 64
    assert margin(after, before) > 3
    assert margin(after, rand) > 3


def test_quickstart_prompt_is_the_mission_and_the_current_observation(tmp_path):
    from verlog.envs import balrog_protocol
    from verlog.graph_file import load_graph_file

    lg = quickstart(tmp_path).multi_turn.langgraph
    graph_file = load_graph_file(lg.path)
    graph = graph_file.build(RandomActionChatModel(actions=list(ACTIONS)), **lg.graph_kwargs)
    state = asyncio.run(graph.ainvoke(graph_file.episode_input(1_000_000), lg.graph_config))
    first, last = state["prompt"][0].content, state["prompt"][-1].content
    assert len(state["prompt"]) == 2 and first.startswith("go to the ") and first == state["instruction"]
    assert last.startswith("Current Observation:\n") and last.endswith(balrog_protocol.ANSWER_RULE)
