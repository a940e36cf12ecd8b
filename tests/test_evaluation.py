"""``verlog eval`` (verlog/evaluation): BALROG-style aggregation, the episode log it resumes from,
reports, clear errors, and a real run against ``verlog serve-model tiny`` that is killed and
resumed without playing finished episodes again."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from verlog.cli import main
from verlog.config import ConfigError
from verlog.evaluation import EpisodeLog, EpisodeRecord, mean_se, plan_tasks, summarize, summary_table
from verlog.evaluation.report import plot_progression, write_json
from verlog.evaluation.runner import episode_progression

ROOT = Path(__file__).resolve().parents[1]


def record(
    env: str, task: str, seed: int, progression: float, *, status: str = "ok", ret: float = 0.0
) -> EpisodeRecord:
    return EpisodeRecord(
        f"{env}/{task}/{seed}",
        env,
        task,
        seed,
        status,
        turns=3,
        episode_return=ret,
        success=status == "ok" and progression == 100.0,
        progression=progression,
        seconds=0.1,
    )


def _said(capsys) -> str:
    """What a command printed, on either stream (the CLI prints some errors on stderr)."""
    captured = capsys.readouterr()
    return captured.out + captured.err


def hand_made() -> list[EpisodeRecord]:
    return [
        *(record("a", "a1", s, p) for s, p in enumerate([100.0, 0.0, 100.0, 0.0])),
        *(record("a", "a2", s, 50.0, ret=1.0) for s in range(2)),
        record("b", "b", 0, 10.0),
        record("b", "b", 1, 20.0),
        record("b", "b", 2, 30.0, status="timeout"),
    ]


# ------------------------------------------------------------------------------ aggregation
def test_progression_is_averaged_per_task_then_environment_then_overall():
    records = [*hand_made(), record("b", "b", 3, 90.0, status="error")]  # a crash: left out, as BALROG does
    summary = summarize(records, order=[("b", "b"), ("a", "a1"), ("a", "a2")])
    b, a1, a2 = summary.tasks
    assert [t.task for t in summary.tasks] == ["b", "a1", "a2"] and a1.env == "a"
    assert (a1.progression, a1.progression_se) == pytest.approx(mean_se([100, 0, 100, 0]))
    assert a1.progression_se == pytest.approx(50.0 / 2)  # BALROG's: sd with divisor n, over sqrt(n)
    assert (a1.win_rate, a2.win_rate, a2.progression, a2.progression_se) == (0.5, 0.0, 50.0, 0.0)
    assert a2.return_mean == 1.0 and b.failed == 1 and b.episodes == 3 and b.errors == 1
    assert (b.progression, b.progression_se) == pytest.approx((20.0, math.sqrt(200 / 3) / math.sqrt(3)))

    env_b, env_a = summary.envs  # environments in the order of their first task
    assert env_a.name == "a" and env_a.parts == 2 and env_a.episodes == 6
    # an environment is the mean over all its episodes (BALROG's), not the mean of its tasks
    assert (env_a.progression, env_a.progression_se) == pytest.approx(mean_se([100, 0, 100, 0, 50, 50]))
    assert (env_b.progression, env_b.progression_se) == pytest.approx((b.progression, b.progression_se))
    # overall: BALROG's mean over environments, not over episodes
    overall = summary.overall
    assert overall.progression == pytest.approx((50.0 + 20.0) / 2) and overall.episodes == 9
    assert overall.progression_se == pytest.approx(math.sqrt(env_a.progression_se**2 + env_b.progression_se**2) / 2)
    assert summarize([]).overall is None


def test_episode_progression_follows_balrog():
    assert episode_progression("crafter", {"achievements": ["collect_wood", "place_table"]}, False) == pytest.approx(
        100 * 2 / 22
    )
    assert episode_progression("textworld", {"score": 3, "max_score": 12, "won": False}, False) == 25.0
    assert episode_progression("nethack", {"max_depth": 2, "max_experience_level": 1}, False) == pytest.approx(
        1.54, abs=0.01
    )
    assert episode_progression("minihack", {"progression": 1.0}, True) == 100.0
    # a game without a BALROG definition scores its goal
    assert episode_progression("guess_number", {"success": True}, True) == 100.0
    assert episode_progression("guess_number", {}, False) == 0.0


def test_episode_log_round_trip_skips_a_line_cut_by_a_kill(tmp_path):
    log = EpisodeLog(tmp_path / "out")
    first, second = record("a", "t", 0, 100.0, status="error"), record("a", "t", 1, 0.0)
    log.append(first)
    log.append(second)
    log.close()
    with log.path.open("a") as f:  # killed while writing
        f.write('{"episode_id": "a/t/2", "env": "a", "ta')
    assert set(log.read()) == {"a/t/0", "a/t/1"} and log.skipped_lines == 1
    retried = record("a", "t", 0, 100.0)
    log.append(retried)  # starts on a fresh line
    log.close()
    back = log.read()
    assert back["a/t/0"].status == "ok" and back["a/t/1"] == second and log.skipped_lines == 1
    line = json.loads(log.path.read_text().splitlines()[0])
    assert {"episode_id", "task", "seed", "status", "turns", "return", "success", "progression", "seconds"} <= set(line)


def test_summary_table_json_and_chart(tmp_path):
    from rich.console import Console

    summary = summarize(hand_made())
    console = Console(width=100, record=True)
    console.print(summary_table(summary, "evaluation of m"))
    text = console.export_text()
    assert "overall (2 envs)" in text and "35.0±" in text and "  a1" in text
    data = json.loads(write_json(tmp_path / "s.json", summary, model="m").read_text())
    assert data["model"] == "m" and data["overall"]["progression"] == pytest.approx(35.0)
    assert [e["name"] for e in data["envs"]] == ["a", "b"] and len(data["tasks"]) == 3
    pytest.importorskip("matplotlib")
    png = plot_progression(summary, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_balrog_suite_names_six_environments():
    tasks = plan_tasks([], ["eval.episodes=2"], suite="balrog")
    assert list(dict.fromkeys(t.env for t in tasks)) == [
        "babyai",
        "babaisai",
        "crafter",
        "textworld",
        "minihack",
        "nethack",
    ]
    cooking = next(t for t in tasks if t.name == "the_cooking_game")
    assert cooking.graph_kwargs["game"] == "cooking" and cooking.config.eval.episodes == 2
    with pytest.raises(ConfigError, match="known suites: balrog"):
        plan_tasks([], suite="no-such-suite")


def test_bad_invocations_fail_in_one_line(tmp_path, capsys):
    config = str(ROOT / "configs" / "guess_number.yaml")
    assert main(["eval", config, "--model", "tiny"]) == 2
    assert "--base-url and --model go together" in _said(capsys)
    assert main(["eval", config, "--checkpoint", str(tmp_path / "none")]) == 2
    assert "no checkpoint in" in _said(capsys)
    assert main(["eval", "--no-chart"]) == 2
    assert "nothing to evaluate" in _said(capsys)


def test_unreachable_endpoint_is_one_clear_line(tmp_path, capsys):
    pytest.importorskip("langchain_openai")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serve_load import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    code = main(
        [
            "eval",
            str(ROOT / "configs" / "guess_number.yaml"),
            "--base-url",
            url,
            "--model",
            "tiny",
            "--out",
            str(tmp_path / "out"),
            "--no-chart",
        ]
    )
    out = _said(capsys)
    assert code == 2
    [error] = [line for line in out.splitlines() if "error" in line]
    assert error.startswith("error: cannot reach the OpenAI-compatible endpoint") and url in error
    assert "Traceback" not in out


# ------------------------------------------------------------------ a real endpoint, killed and resumed
@pytest.fixture(scope="module")
def served_tiny():
    """``verlog serve-model tiny`` on a free loopback port (the helpers of benchmarks/serve_load.py)."""
    pytest.importorskip("langchain_openai")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serve_load import free_port, wait_healthy

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "verlog.serve", "serve-model", "tiny", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", server, timeout_s=120))
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=30)


#: how long a step of a subprocess test may take before it counts as hung (generous: a machine at load 30
#: runs these steps many times slower than an idle one, and no test measures speed)
HANG_S = 900


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by the kill
    return out


def _start_and_kill(cmd: list[str], episodes: Path, at_least: int, sig: int) -> subprocess.Popen:
    # a shell starts background jobs with SIGINT ignored, and Python keeps an inherited "ignore":
    # the command gets the disposition a user's terminal gives it
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + HANG_S  # a bound against a hang, not a speed: a busy machine is slow
    while len(_lines(episodes)) < at_least:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, f"no episodes written in {HANG_S} s"
        time.sleep(0.05)
    process.send_signal(sig)
    process.wait(timeout=HANG_S)
    return process


def test_eval_against_serve_model_resumes_after_a_kill(served_tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "eval"
    episodes = out / "episodes.jsonl"
    total = 24
    cmd = [
        sys.executable,
        "-m",
        "verlog.cli",
        "eval",
        "configs/guess_number.yaml",
        "multi_turn.langgraph.graph_kwargs.max_guesses=3",
        "--base-url",
        served_tiny,
        "--model",
        "tiny",
        "--episodes",
        str(total),
        "--concurrency",
        "2",
        "--out",
        str(out),
    ]

    # Ctrl-C: a clean stop that says how to go on
    first = _start_and_kill(cmd, episodes, 2, signal.SIGINT)
    assert first.returncode == 130, first.stdout.read()
    assert "run the same command again" in first.stdout.read()
    # SIGKILL: no clean-up at all
    second = _start_and_kill(cmd, episodes, len(_lines(episodes)) + 2, signal.SIGKILL)
    assert second.returncode == -signal.SIGKILL
    before = _lines(episodes)
    killed_at = time.time()
    assert 4 <= len(before) < total

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(before)} finished earlier, {total - len(before)} to play" in done.stdout
    after = _lines(episodes)
    ids = [r["episode_id"] for r in after]
    assert len(ids) == len(set(ids)) == total  # nothing was played twice
    assert after[: len(before)] == before  # the finished episodes are untouched ...
    assert all(r["finished_at"] >= killed_at for r in after[len(before) :])  # ... and only the rest was played
    assert {r["seed"] for r in after} == set(range(1_000_000, 1_000_000 + total))
    assert all(r["status"] == "ok" and r["turns"] == 3 and r["progression"] in (0.0, 100.0) for r in after)

    summary = json.loads((out / "summary.json").read_text())
    [task] = summary["tasks"]
    assert task["episodes"] == total and summary["overall"]["episodes"] == total and summary["model"] == "tiny"
    assert (out / "progression.png").is_file()
    assert "guess_number" in done.stdout and "±" in done.stdout

    # run again, a finished evaluation plays nothing; other settings in the same folder are refused
    args = cmd[cmd.index("eval") :]
    assert main([*args, "--no-chart"]) == 0
    assert f"{total} finished earlier, 0 to play" in _said(capsys) and len(_lines(episodes)) == total
    assert main([*args, "--temperature", "0.2"]) == 2
    assert "played with other settings" in _said(capsys)


def test_graph_kwargs_win_over_a_suites_and_say_the_run_is_not_its_protocol(served_tiny, tmp_path, capsys):
    """``--graph-kwargs`` (a smoke run: short caps and answers) update every task's graph settings
    last; a suite setting they change is named on the console and in the summary."""
    suite = tmp_path / "mini.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "babyai": {
                    "config": str(ROOT / "configs" / "babyai.yaml"),
                    "overrides": {"rollout.episode_timeout_s": None},
                    "graph_kwargs": {"protocol": "balrog", "history_turns": 16, "max_tokens": 8192, "max_steps": None},
                    "tasks": [
                        {"name": "goto", "graph_kwargs": {"task": "goto"}},
                        {"name": "open", "graph_kwargs": {"task": "open"}},
                    ],
                }
            }
        )
    )
    out = tmp_path / "out"
    args = [
        "eval",
        "--suite",
        str(suite),
        "--base-url",
        served_tiny,
        "--model",
        "tiny",
        "--episodes",
        "2",
        "--graph-kwargs",
        '{"max_steps": 3, "max_tokens": 4}',
        "--out",
        str(out),
        "--no-chart",
    ]
    assert main(args) == 0
    said = _said(capsys)
    assert (
        "not the suite's protocol: balrog_source, max_steps, max_tokens differ from it (balrog_source: no --balrog"
        in said
    )
    records = _lines(out / "episodes.jsonl")
    assert len(records) == 4 and all(r["status"] == "ok" and r["turns"] == 3 for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["graph_kwargs_override"] == {"max_steps": 3, "max_tokens": 4}
    assert summary["not_the_suites_protocol"] == ["balrog_source", "max_steps", "max_tokens"]
    assert main([*args[:-5], "--graph-kwargs", "[3]", "--out", str(out), "--no-chart"]) == 2
    assert "error: --graph-kwargs (build_graph's keyword arguments) must be a JSON object" in _said(capsys)
