"""The ``serve-model`` / ``serve`` commands and the load test (a second process, loopback only)."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verlog.serve.commands import add_serve_commands, main
from verlog.serve.langgraph_dev import GraphServeSettings, langgraph_config, server_environment

ROOT = Path(__file__).resolve().parents[1]


def test_add_serve_commands_registers_both_on_verlogs_subparsers():
    parser = argparse.ArgumentParser(prog="verlog")
    add_serve_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve-model", "tiny"])
    assert (args.command, args.checkpoint, args.host, args.api_key) == ("serve-model", "tiny", "127.0.0.1", None)
    args = parser.parse_args(
        [
            "serve",
            "graphs/calculator.py",
            "--base-url",
            "http://127.0.0.1:8000/v1",
            "--model",
            "tiny",
            "--api-key",
            "k",
            "--graph-kwargs",
            '{"max_tool_rounds": 2}',
        ]
    )
    assert (args.command, args.host, args.graph_kwargs, args.api_key) == (
        "serve",
        "127.0.0.1",
        {"max_tool_rounds": 2},
        "k",
    )
    assert callable(args.func)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "graphs/calculator.py"])  # --base-url and --model are required


def test_commands_fail_clearly(capsys):
    assert main(["serve-model", "no-such-checkpoint"]) == 2
    assert "no checkpoint in 'no-such-checkpoint': expected one of 'tiny'" in capsys.readouterr().err
    assert main(["serve", "graphs/missing.py", "--base-url", "http://127.0.0.1:1/v1", "--model", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_serve_refuses_a_taken_port_instead_of_printing_an_address_it_will_not_bind(capsys, tmp_path):
    """LangGraph's server moves to another port when its port is taken; `verlog serve` would then
    have printed an address that leads to whatever holds the port: it stops with one error line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                "serve",
                str(ROOT / "graphs" / "calculator.py"),
                "--base-url",
                "http://127.0.0.1:1/v1",
                "--model",
                "x",
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path),
            ]
        )
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: cannot serve on 127.0.0.1:{port}: the port is taken" in err and "--port" in err
    assert "serving graph" not in err  # nothing announced


def test_serve_settings_keep_the_key_off_the_disk(tmp_path):
    uri = "postgresql://agent:pa55@db:5432/threads"
    settings = GraphServeSettings(
        graph=ROOT / "graphs" / "calculator.py",
        base_url="http://127.0.0.1:8000/v1",
        model="tiny",
        api_key="s3cret",
        temperature=0.0,
        state_dir=tmp_path,
        postgres_uri=uri,
    )
    config = langgraph_config(settings)
    assert config["graphs"] == {"calculator": "verlog.serve.langgraph_app:graph"}
    assert config["checkpointer"] == {"path": "verlog.serve.durable.checkpointer"}  # durable threads
    assert config["dependencies"] == [str(ROOT)]
    assert "s3cret" not in json.dumps(config) and "pa55" not in json.dumps(config)
    env = server_environment(settings, base={})
    assert env["VERLOG_API_KEY"] == "s3cret" and env["VERLOG_TEMPERATURE"] == "0.0"
    assert env["VERLOG_POSTGRES_URI"] == uri and env["VERLOG_STATE_DB"] == str(tmp_path.resolve() / "threads.sqlite")
    assert env["VERLOG_GRAPH"] == str(ROOT / "graphs" / "calculator.py") and env["VERLOG_GRAPHS_DIR"] == ""


def test_langgraph_app_builds_graphs_with_chat_openai(monkeypatch):
    pytest.importorskip("langchain_openai")
    import importlib

    monkeypatch.setenv("VERLOG_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("VERLOG_MODEL", "tiny")
    monkeypatch.setenv("VERLOG_TEMPERATURE", "0")
    monkeypatch.setenv("VERLOG_GRAPH", str(ROOT / "graphs" / "guess_number.py"))
    monkeypatch.setenv("VERLOG_GRAPH_KWARGS", '{"max_guesses": 3}')
    monkeypatch.setenv("VERLOG_GRAPHS_DIR", str(ROOT / "graphs"))
    import verlog.serve.langgraph_app as app

    app = importlib.reload(app)
    for name in ("graph", "calculator", "guess_number", "babyai"):
        assert hasattr(getattr(app, name), "ainvoke"), name
    model = app.chat_model_from_env()
    assert (model.model_name, model.temperature, model.openai_api_base) == ("tiny", 0.0, "http://127.0.0.1:9/v1")
    with pytest.raises(RuntimeError, match="VERLOG_BASE_URL"):
        app.chat_model_from_env({"VERLOG_MODEL": "tiny"})


def test_load_test_from_a_second_process(monkeypatch):
    """benchmarks/serve_load.py starts `serve-model tiny` and loads it over loopback."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "serve_load.py"),
            "--requests",
            "60",
            "--concurrency",
            "8",
            "--max-tokens",
            "8",
            "--duration-s",
            "60",
            "--bad-fraction",
            "0.2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "requests/s (good)" in out.stdout and "latency p50/p90/p99" in out.stdout
    assert "bad requests got 4xx: yes; every good request got 200: yes" in out.stdout, out.stdout
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["serve_load.py", "--url", "http://10.1.2.3:8000"])
    import serve_load

    with pytest.raises(SystemExit, match="loopback"):
        serve_load.main()
