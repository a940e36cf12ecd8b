"""A user's production agent on the user's data: a graph file with no verlog import (LangGraph's
prebuilt agent, LangChain's ``create_agent``), a JSONL file of question/answer rows and a reward
function outside the graph, through ``verlog train``, ``verlog eval`` and ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verlog.cli import main
from verlog.data import EpochOrder
from verlog.rollout.schedule import slot_seed

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ROOT / "tests" / "graphs"
NUM_ENVS, GROUP = 8, 4
GROUPS = NUM_ENVS // GROUP

REWARD = '''
import json


def digits(completion: str) -> float:
    """A reward the random tiny model's answers differ on (so GRPO groups are not all tied)."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def logged(key, row, completion, log):
    with open(log, "a") as f:
        f.write(json.dumps({"key": key, "split": row["split"], "prompt": row["prompt"]}) + "\\n")
    return 0.0
'''


def rows(split: str, n: int, start: int) -> list[dict]:
    return [
        {"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "split": split} for i in range(start, start + n)
    ]


@pytest.fixture
def project(tmp_path) -> dict[str, Path]:
    paths = {"reward": tmp_path / "reward.py", "log": tmp_path / "played.jsonl"}
    paths["reward"].write_text(REWARD)
    for split, n, start in (("train", 50, 0), ("validation", 6, 100), ("test", 8, 200)):
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows(split, n, start)))
    return paths


def settings(p: dict[str, Path], run_dir: Path, graph: str, *extra: str) -> list[str]:
    functions = [
        {"function": f"{p['reward']}:digits", "weight": 1.0},
        {"function": f"{p['reward']}:logged", "weight": 0.0, "kwargs": {"log": str(p["log"])}},
    ]
    return [
        f"multi_turn.langgraph.path={GRAPHS / graph}",
        "multi_turn.langgraph.graph_kwargs={}",
        "multi_turn.langgraph.graph_config={recursion_limit: 12}",
        f"data.train={p['train']}",
        f"data.validation={p['validation']}",
        f"data.test={p['test']}",
        f"reward.functions={json.dumps(functions)}",
        f"trainer.run_dir={run_dir}",
        f"trainer.num_envs={NUM_ENVS}",
        f"trainer.group_size={GROUP}",
        "trainer.turns_per_env=4",
        "trainer.torch_threads=1",
        "sampling.max_tokens=12",
        "wandb.mode=disabled",
        "algorithm.mini_batch_turns=32",
        "actor.lr=1.0e-4",
        "eval.at_start=false",
        "rollout.episode_timeout_s=60",
        *extra,
    ]


def played(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def updates_of(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind", "update") == "update" and "episode_return" in r]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("graph", ["prebuilt_react_agent.py", "prebuilt_create_agent.py"])
def test_a_prebuilt_agent_trains_on_a_jsonl_file_with_an_external_reward(project, tmp_path, graph):
    source = (GRAPHS / graph).read_text()
    assert "verlog" not in source.replace('"""', "").split("\n\n", 1)[1]  # no verlog import, no verlog call
    run_dir = tmp_path / "run"
    args = settings(project, run_dir, graph, "trainer.total_updates=3", "trainer.save_every=0")
    assert main(["train", str(ROOT / "configs" / "calculator.yaml"), *args]) == 0
    updates = updates_of(run_dir)
    assert [u["update"] for u in updates] == [1, 2, 3]
    for u in updates:
        # the episodes' return is exactly the external reward (the graph reports none): weight 1 x digits
        assert u["episode_return"] == pytest.approx(u["reward/digits"], abs=1e-6)
        assert u["failed_episodes"] == 0 and u["episodes"] > 0
    assert any(u["actor_grad_norm"] > 0 for u in updates)  # groups were not all tied: the actor learned
    log = played(project["log"])
    train_prompts = {r["prompt"] for r in rows("train", 50, 0)}
    assert {r["split"] for r in log if r["prompt"] in train_prompts} == {"train"}
    # the final evaluation played every test row once, and nothing else
    test_log = [r for r in log if r["split"] != "train"]
    assert sorted(r["key"] for r in test_log) == list(range(8)) and {r["split"] for r in test_log} == {"test"}
    after = json.loads((run_dir / "eval.json").read_text())["after"][0]
    assert after["episodes"] == 8


@pytest.mark.timeout(600)
def test_evaluation_plays_only_held_out_rows_and_resume_continues_the_epoch(project, tmp_path):
    run_dir = tmp_path / "run"
    graph = "prebuilt_react_agent.py"
    config = str(ROOT / "configs" / "calculator.yaml")
    base = settings(project, run_dir, graph, "trainer.save_every=1", "eval.at_end=false")
    assert main(["train", config, *base, "trainer.total_updates=2", "trainer.eval_every=1"]) == 0
    first = played(project["log"])
    project["log"].unlink()
    state = json.loads((run_dir / "checkpoints" / "update_000002" / "state.json").read_text())
    started = state["runner"]["episodes_started"]
    assert main(["train", config, *base, "trainer.total_updates=4", "--resume"]) == 0
    second = played(project["log"])

    # periodic validation (eval_every: 1, after update 1) played validation rows only
    validation = [r for r in first if r["split"] != "train"]
    assert {r["split"] for r in validation} == {"validation"} and sorted(r["key"] for r in validation) == list(range(6))
    # training rows follow the epoch's order: round j of group g plays task slot_seed(0, j, g, G)
    order = EpochOrder(50, seed=0)
    position = {order.row_index(i): i for i in range(50)}

    def tasks_of(log):
        return [position[r["key"]] for r in log if r["split"] == "train"]

    before, after = tasks_of(first), tasks_of(second)
    assert before and after and max(before + after) < 50  # one epoch, not wrapped
    assert not set(before) & set(after)  # no row played twice by a group: the resumed run went on with the epoch
    in_flight = state["runner"]["in_flight"]
    for g in range(GROUPS):
        # each slot first plays again the round it had in flight at the checkpoint (not scored before it)
        mine = slice(g * GROUP, (g + 1) * GROUP)
        resumed_at = min(n if r is None else r for r, n in zip(in_flight[mine], started[mine]))
        ours = [t for t in after if (t - slot_seed(0, t // GROUPS, g, GROUPS)) == 0]
        assert ours and min(ours) >= slot_seed(0, resumed_at, g, GROUPS)
        assert slot_seed(0, resumed_at, g, GROUPS) not in before
    assert not set(range(GROUPS)) & set(after)  # the epoch did not start over

    # verlog eval on the checkpoint plays the test split: every test row once, no training row
    project["log"].unlink()
    out = tmp_path / "eval"
    assert main(["eval", config, *base, "--checkpoint", str(run_dir), "--out", str(out), "--no-chart"]) == 0
    evaluated = played(project["log"])
    assert sorted(r["key"] for r in evaluated) == list(range(8)) and {r["split"] for r in evaluated} == {"test"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["prebuilt_react_agent"]["split"] == "test"


KILLED_REWARD = '''
import json, os, time


def logged(key, row, log, run_dir, stop_at_checkpoint):
    """Log each scored play; the first run stops scoring once it has saved a checkpoint (it is then
    killed), so its log holds exactly the plays scored before that checkpoint."""
    if stop_at_checkpoint and os.path.isdir(os.path.join(run_dir, "checkpoints")) and any(
            name.startswith("update_") for name in os.listdir(os.path.join(run_dir, "checkpoints"))):
        time.sleep(3600)
    with open(log, "a") as f:
        f.write(json.dumps({"key": key, "prompt": row["prompt"]}) + "\\n")
    return 0.0
'''


@pytest.mark.timeout(600)
@pytest.mark.parametrize("estimator,group_size", [("rloo", 1), ("grpo", 2)])
def test_a_killed_run_resumed_plays_every_row_once_per_epoch(tmp_path, estimator, group_size):
    """kill -9 after the first checkpoint, then --resume: the episodes in flight at the checkpoint
    are played again, so across the kill every task of the epochs is played exactly once (by each
    slot of its group: with GRPO's whole groups, ``group_size`` times)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from verlog.weights import checkpoint as ckpt

    rows_file = tmp_path / "train.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows("train", 12, 0)))
    (tmp_path / "killed_reward.py").write_text(KILLED_REWARD)
    run_dir, num_envs = tmp_path / "run", 4
    logs = {"first": tmp_path / "first.jsonl", "second": tmp_path / "second.jsonl"}

    def args(which: str, total: int) -> list[str]:
        function = {
            "function": f"{tmp_path / 'killed_reward.py'}:logged",
            "kwargs": {"log": str(logs[which]), "run_dir": str(run_dir), "stop_at_checkpoint": which == "first"},
        }
        return [
            "train",
            str(ROOT / "configs" / "calculator.yaml"),
            f"multi_turn.langgraph.path={GRAPHS / 'prebuilt_react_agent.py'}",
            "multi_turn.langgraph.graph_kwargs={}",
            "multi_turn.langgraph.graph_config={recursion_limit: 12}",
            f"data.train={rows_file}",
            "data.validation=null",
            "data.test=null",
            f"reward.functions=[{json.dumps(function)}]",
            f"trainer.run_dir={run_dir}",
            f"trainer.num_envs={num_envs}",
            f"trainer.group_size={group_size}",
            f"algorithm.estimator={estimator}",
            "trainer.turns_per_env=3",
            "trainer.torch_threads=1",
            "sampling.max_tokens=8",
            "wandb.mode=disabled",
            "algorithm.mini_batch_turns=12",
            "eval.at_start=false",
            "eval.at_end=false",
            "trainer.save_every=1",
            f"trainer.total_updates={total}",
        ]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "verlog.cli", *args("first", 1000)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while ckpt.latest_checkpoint(run_dir) is None:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    time.sleep(0.5)  # episodes of the next batch start (and stop at scoring) meanwhile
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = ckpt.read_state(ckpt.latest_checkpoint(run_dir))
    assert saved["update"] == 1
    # one slot per group: slot episodes cut by the boundary are in flight; whole groups start rows
    # only while a batch is collected, so at a checkpoint a group has a row in flight only if it straddles
    assert group_size > 1 or any(r is not None for r in saved["runner"]["in_flight"])

    assert main(args("second", 6) + ["--resume"]) == 0
    final = ckpt.read_state(ckpt.latest_checkpoint(run_dir))["runner"]
    assert not any(final.get("replays", []))  # no group was cut by a boundary (plays of 1 call, 3 turns a batch)
    # the rounds each group has completed by the end (its round in flight then is not finished)
    groups = num_envs // group_size
    done = [r if r is not None else n for r, n in zip(final["in_flight"], final["episodes_started"])][::group_size]
    assert min(done) >= 12 // groups  # the whole first epoch was played (and more)
    order = EpochOrder(12, seed=0)
    expected = sorted(
        order.row_index(slot_seed(0, j, g, groups))
        for g in range(groups)
        for j in range(done[g])
        for _ in range(group_size)
    )
    scored = sorted(r["key"] for r in played(logs["first"]) + played(logs["second"]))
    assert scored == expected  # every completed task scored once per play: none skipped by the kill, none twice
    first_epoch = [order.row_index(slot_seed(0, j, g, groups)) for g in range(groups) for j in range(12 // groups)]
    assert sorted(first_epoch) == list(range(12))  # ... and the first rounds of the groups are the 12 rows


def test_resume_with_a_changed_data_file_is_refused_in_one_line(project, tmp_path, capsys):
    """``--resume`` after the training file was edited (one row changed, the size the same) is one ``error:`` line naming the split, the file and what changed, the run folder
    untouched; the same rows moved to another path resume."""
    run_dir = tmp_path / "run"
    config = str(ROOT / "configs" / "calculator.yaml")
    base = settings(
        project, run_dir, "prebuilt_react_agent.py", "trainer.save_every=1", "eval.at_end=false", "trainer.num_envs=4"
    )
    assert main(["train", config, *base, "trainer.total_updates=1"]) == 0
    capsys.readouterr()
    original = project["train"].read_text()
    project["train"].write_text(original.replace("What is 7 + 8?", "What is 7 + 9?"))
    saved = (run_dir / "config.yaml").read_text()
    assert main(["train", config, *base, "trainer.total_updates=2", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: data.train: changed since the run in {str(run_dir)!r} began: ")
    assert repr(str(project["train"])) in err and "sha256" in err and "restore the file" in err
    assert (run_dir / "config.yaml").read_text() == saved and not (run_dir / "checkpoints" / "update_000002").exists()
    moved = tmp_path / "moved" / "train.jsonl"
    moved.parent.mkdir()
    moved.write_text(original)
    assert main(["train", config, *base, f"data.train={moved}", "trainer.total_updates=2", "--resume"]) == 0
    assert [u["update"] for u in updates_of(run_dir)] == [1, 2]
