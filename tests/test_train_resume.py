"""Resume: a training process killed (SIGKILL) after update k continues at update k + 1 with the
same counters, and no checkpoint or complete metrics record it had written is lost (a record cut
by the kill is dropped with a warning)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verlog.weights import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, TURNS = 4, 3
WARMUP_BATCHES = 1  # critic_warmup.buffer_multiplier


def command(run_dir: Path, total_updates: int, *extra: str) -> list[str]:
    from verlog.models import toy_model_dir

    return [
        sys.executable,
        "-m",
        "verlog.cli",
        "train",
        str(ROOT / "configs" / "cue_corridor.yaml"),
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        f"trainer.total_updates={total_updates}",
        f"trainer.num_envs={NUM_ENVS}",
        f"trainer.turns_per_env={TURNS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=3",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "eval.at_start=false",
        "eval.at_end=false",
        "algorithm.mini_batch_turns=6",
        *extra,
    ]


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_killed_run_resumes_at_the_next_update(tmp_path):
    killed_run_resumes(tmp_path)


@pytest.mark.slow
def test_killed_overlapped_run_resumes_at_the_next_update(tmp_path):
    """The same with overlapped updates in their own process: the checkpoint holds the counters at
    its batch's cut (not the batch played ahead), and the update process dies with its trainer."""
    killed_run_resumes(tmp_path, "trainer.overlap.enabled=true", "trainer.overlap.update_in=process")


def killed_run_resumes(tmp_path, *extra: str) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        command(run_dir, 1000, *extra), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 240
    # until checkpoints/latest names update 2 (a checkpoint's folder is renamed into place before
    # the pointer moves to it: a kill between the two resumes from the one before, also correct)
    while not (run_dir / "checkpoints" / "latest").is_file() or ckpt.latest_checkpoint(run_dir).name < "update_000002":
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint 2 in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.wait()

    completed = ckpt.checkpoint_dirs(run_dir)
    latest = ckpt.latest_checkpoint(run_dir)
    k = ckpt.read_state(latest)["update"]
    assert k >= 2 and latest.name == f"update_{k:06d}" and latest in completed
    saved = {p.name: ckpt.read_state(p) for p in completed}
    state_k = saved[latest.name]

    with (run_dir / "metrics.jsonl").open("a") as f:  # as if killed while writing a record
        f.write('{"update": 999, "kind": "upd')

    done = subprocess.run(
        command(run_dir, k + 2, "--resume", *extra), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"(update {k})" in done.stdout
    assert "dropped a cut last line" in done.stdout  # said, and mended: every record below parses

    updates = records(run_dir, "update")
    assert [r["update"] for r in updates] == list(range(1, k + 3))  # each update once, none lost or redone twice
    for r in updates:  # the counters run on across the kill as if nothing had happened
        assert r["turns_total"] == (WARMUP_BATCHES + r["update"]) * NUM_ENVS * TURNS
    episodes = [r["episodes_total"] for r in updates]
    assert episodes == sorted(episodes)
    assert len(records(run_dir, "critic_warmup")) == 1  # the warm-up is not redone

    final = ckpt.latest_checkpoint(run_dir)
    assert final.name == f"update_{k + 2:06d}"
    state = ckpt.read_state(final)
    assert state["runner"]["counters"]["turns"] == (WARMUP_BATCHES + k + 2) * NUM_ENVS * TURNS
    assert state["runner"]["counters"]["batches"] == state_k["runner"]["counters"]["batches"] + 2
    # every slot went on with its own seeds: it first played again the episode it had in flight at
    # the checkpoint (its round, from the start), never an earlier round
    for before, after, in_flight, now in zip(
        state_k["runner"]["episodes_started"],
        state["runner"]["episodes_started"],
        state_k["runner"]["in_flight"],
        state["runner"]["in_flight"],
    ):
        assert in_flight == before - 1 and after >= before
        assert now is None or now >= in_flight
    # the checkpoints that survived the kill are intact (rotation keeps the 3 newest)
    for p in ckpt.checkpoint_dirs(run_dir):
        assert (p / "actor" / "model.safetensors").is_file() and (p / "critic.safetensors").is_file()
