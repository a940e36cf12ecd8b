"""The ``verlog`` command line: ``rollout`` and ``play`` run as a user runs them (a real subprocess:
the smoke tests of those commands), the other checks in this process through ``verlog.cli.main``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from verlog.cli import main

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = str(ROOT / "configs" / "calculator.yaml")


def verlog(*args: str, stdin: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verlog.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )


def test_rollout_prints_turns_and_writes_json(tmp_path):
    out = tmp_path / "turns.json"
    result = verlog(
        "rollout",
        "configs/guess_number.yaml",
        "rollout.episodes=2",
        "multi_turn.langgraph.graph_kwargs.max_tokens=8",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "rollout summary" in result.stdout and "turn 0 node=policy" in result.stdout
    episodes = json.loads(out.read_text())
    assert len(episodes) == 2
    turn = episodes[0]["turns"][0]
    assert len(turn["logprobs"]) == len(turn["response_ids"]) <= 9 and turn["prompt_ids"]


def test_bad_config_key_is_a_clear_error(capsys):
    assert main(["rollout", CALCULATOR, "sampling.temprature=0"]) == 2
    err = capsys.readouterr().err
    assert "sampling.temprature: unknown key" in err and "temperature" in err


def test_error_messages_keep_their_brackets(capsys):
    # rich would read "[0.5]" or "pip install 'verlog[verl]'" as markup and drop it
    assert main(["rollout", CALCULATOR, "sampling.temperature=[0.5]"]) == 2
    assert "(got [0.5])" in capsys.readouterr().err


def test_graph_file_without_factory_is_a_clear_error(tmp_path, capsys):
    graph = tmp_path / "empty.py"
    graph.write_text("x = 1\n")
    assert main(["rollout", CALCULATOR, f"multi_turn.langgraph.path={graph}"]) == 2
    assert "has no build_graph(model, **kwargs) function" in capsys.readouterr().err


def test_play_by_hand_and_by_bot():
    human = verlog("play", "babyai:goto", "--seed", "0", stdin="turn left\nfly away\nquit\n")
    assert human.returncode == 0, human.stderr
    assert "Mission: go to" in human.stdout and "turn left" in human.stdout
    bot = verlog("play", "babaisai:two_room-goto_win", "--seed", "1", "--agent", "bot")
    assert bot.returncode == 0 and "success True" in bot.stdout


def test_play_random_agent_and_clear_errors(capsys):
    assert main(["play", "babyai:goto", "--seed", "2", "--agent", "random", "--max-steps", "3"]) == 0
    assert capsys.readouterr().out.count("> ACTION: ") == 3
    assert main(["play", "guess", "--agent", "bot"]) == 2
    out, err = capsys.readouterr()
    assert "unknown environment 'guess'" in err and "babyai:goto" in err
    assert "Traceback" not in out + err


def test_examples_run():
    for script in ("examples/programmatic_rollout.py", "examples/sglang_protocol.py"):
        result = subprocess.run(
            [sys.executable, script, *(["--episodes", "2"] if "programmatic" in script else [])],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert ": ok," in result.stdout, result.stdout


def test_a_missing_optional_package_is_one_error_line_naming_its_extra(tmp_path, capsys, monkeypatch):
    """A command whose game needs a package this machine lacks (an offline GPU bundle leaves crafter
    out) stops in one ``error:`` line naming the module and the extra that installs it."""
    import builtins

    real_import = builtins.__import__

    def without_crafter(name, *args, **kwargs):
        if name == "crafter" or name.startswith("crafter."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_crafter)
    for name in [m for m in sys.modules if m.split(".")[0] == "crafter" or m.startswith("verlog.envs.crafter")]:
        monkeypatch.delitem(sys.modules, name)  # imported by an earlier test: made to import again
    assert main(["play", "crafter", "--agent", "random", "--max-steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    assert "'crafter'" in err and "verlog[envs]" in err and "docs/gpu.md" in err


def test_rollout_whose_every_episode_failed_exits_non_zero(tmp_path, capsys):
    """A graph that raises in every episode: the turns and summary are printed, then one error
    line naming the first failure, and the exit status is 1 (a script must not read it as done)."""
    graph = tmp_path / "broken.py"
    graph.write_text(
        "from langgraph.graph import END, START, MessagesState, StateGraph\n\n\n"
        "def build_graph(model, **graph_kwargs):\n"
        "    async def policy(state):\n"
        "        await model.ainvoke(state['messages'])\n"
        "        raise RuntimeError('the tool broke')\n\n"
        "    g = StateGraph(MessagesState)\n"
        "    g.add_node('policy', policy)\n"
        "    g.add_edge(START, 'policy')\n"
        "    g.add_edge('policy', END)\n"
        "    return g.compile()\n"
    )
    code = main(
        ["rollout", CALCULATOR, f"multi_turn.langgraph.path={graph}", "--episodes", "2", "sampling.max_tokens=4"]
    )
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "rollout summary" in out
    assert "error: every episode failed (2 of 2); the first (error):" in err and "the tool broke" in err
    assert "Traceback" not in err


def test_eval_help_answers_without_loading_torch():
    """``verlog eval --help`` as a user types it: the help, and no torch (nor LangGraph) imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "verlog.cli", "eval", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "--checkpoint" in result.stdout and "--vision" in result.stdout
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "verlog.config" in imported  # (the import log is read: eval's arguments name its splits)
    assert not {"torch", "transformers", "langgraph"} & imported
