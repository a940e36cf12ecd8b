"""``verlog serve GRAPH``: one graph file behind LangGraph's own server (``langgraph dev``).

LangGraph's server (``langgraph-cli[inmem]``) already gives a graph what a service needs:
threads with a checkpointer (a ``thread_id`` per conversation or episode), runs that wait or
stream (``updates``, ``values``, ``messages``, ``custom`` events), assistants, and a Python/JS
SDK (``langgraph_sdk``). So verlog does not grow its own graph server: it writes a
``langgraph.json`` naming :mod:`verlog.serve.langgraph_app`'s ``graph`` and verlog's durable
checkpointer (:mod:`verlog.serve.durable`: SQLite in the state folder, or Postgres), passes the
model settings as ``VERLOG_*`` environment variables (the API key and the database address never
touch the disk) and runs ``langgraph dev --no-browser --no-reload`` in a state folder outside the
project. The graph entry is importable Python (``verlog.serve.langgraph_app``), which is what
``langgraph build``/``langgraph up`` (Docker) read too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from verlog.graph_file import load_graph_file

#: what the generated langgraph.json names the served graph's module variable
GRAPH_TARGET = "verlog.serve.langgraph_app:graph"
#: the checkpointer the generated langgraph.json names (an async context manager, by module path)
CHECKPOINTER_TARGET = "verlog.serve.durable.checkpointer"
#: the SQLite file of the threads' checkpoints, in the state folder
STATE_DB = "threads.sqlite"


@dataclass
class GraphServeSettings:
    """Everything ``verlog serve`` needs to run one graph file behind LangGraph's server."""

    graph: Path
    base_url: str
    model: str
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 2024
    graph_id: str | None = None
    graph_kwargs: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    #: every run's recursion limit; ``None``: the graph's own (see :func:`verlog.serve.langgraph_app.with_own_recursion_limit`)
    recursion_limit: int | None = None
    jobs_per_worker: int | None = None
    allow_blocking: bool = False
    state_dir: Path | None = None
    #: a Postgres connection string: threads' checkpoints there instead of the state folder's SQLite
    postgres_uri: str | None = None

    @property
    def name(self) -> str:
        """The graph id clients use (default: the file's name, e.g. ``guess_number``)."""
        return self.graph_id or self.graph.stem


def state_dir_for(settings: GraphServeSettings) -> Path:
    """Where the server's ``langgraph.json`` and in-memory state live (outside the project); an
    absolute path (the server runs in that folder: a relative one would then point elsewhere)."""
    if settings.state_dir is not None:
        return Path(settings.state_dir).expanduser().resolve()
    from verlog.cache import verlog_cache_dir

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", settings.name)
    return verlog_cache_dir() / "serve" / f"{safe}-{settings.port}"


def langgraph_config(settings: GraphServeSettings) -> dict[str, Any]:
    """The ``langgraph.json`` of one served graph file."""
    graph = settings.graph.resolve()
    project = graph.parent.parent if graph.parent.name == "graphs" else graph.parent
    return {
        "dependencies": [str(project)],
        "graphs": {settings.name: GRAPH_TARGET},
        "checkpointer": {"path": CHECKPOINTER_TARGET},
    }


def server_environment(settings: GraphServeSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the ``langgraph dev`` process: the model, graph and state settings."""
    env = dict(os.environ if base is None else base)
    env["VERLOG_STATE_DB"] = str(state_dir_for(settings).resolve() / STATE_DB)
    if settings.postgres_uri:
        env["VERLOG_POSTGRES_URI"] = settings.postgres_uri
    env.update(
        {
            "VERLOG_GRAPH": str(settings.graph.resolve()),
            "VERLOG_GRAPH_KWARGS": json.dumps(settings.graph_kwargs),
            "VERLOG_GRAPHS_DIR": "",  # serve only this graph
            "VERLOG_BASE_URL": settings.base_url,
            "VERLOG_MODEL": settings.model,
        }
    )
    if settings.recursion_limit is not None:
        env["VERLOG_RECURSION_LIMIT"] = str(settings.recursion_limit)
    if settings.api_key:
        env["VERLOG_API_KEY"] = settings.api_key
    for name, value in (
        ("VERLOG_TEMPERATURE", settings.temperature),
        ("VERLOG_MAX_TOKENS", settings.max_tokens),
        ("VERLOG_SEED", settings.seed),
    ):
        if value is not None:
            env[name] = str(value)
    env.setdefault("LANGGRAPH_CLI_NO_ANALYTICS", "1")  # offline machines: no usage reporting
    return env


def langgraph_dev_command(settings: GraphServeSettings, config_path: Path) -> list[str]:
    """The ``langgraph dev`` command line."""
    cmd = [
        sys.executable,
        "-m",
        "langgraph_cli",
        "dev",
        "--config",
        str(config_path),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--no-browser",
        "--no-reload",
    ]
    if settings.jobs_per_worker:
        cmd += ["--n-jobs-per-worker", str(settings.jobs_per_worker)]
    if settings.allow_blocking:
        cmd.append("--allow-blocking")
    return cmd


def check_installed() -> None:
    """Fail with the install command if LangGraph's server is missing."""
    import importlib.util

    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ModuleNotFoundError:  # its parent package is missing
            return True

    missing = [
        m for m in ("langgraph_cli", "langgraph_api", "langchain_openai", "langgraph.checkpoint.sqlite") if absent(m)
    ]
    if missing:
        raise RuntimeError(
            f"`verlog serve` needs LangGraph's server, LangChain's OpenAI model and LangGraph's SQLite checkpointer "
            f"({', '.join(missing)} missing): pip install -e '.[serve]'  (langgraph-cli[inmem], langchain-openai, "
            "langgraph-checkpoint-sqlite)"
        )


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound, tested as LangGraph's server tests it before binding."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_port(settings: GraphServeSettings) -> None:
    """Fail when the port is taken: LangGraph's server would then quietly bind another port, and
    the address ``verlog serve`` prints would lead clients to whatever holds this one."""
    if not port_is_free(settings.host, settings.port):
        raise RuntimeError(
            f"cannot serve on {settings.host}:{settings.port}: the port is taken (another server?); "
            "choose a free one with --port"
        )


def prepare(settings: GraphServeSettings) -> tuple[list[str], dict[str, str], Path]:
    """Check the graph file and the port, write ``langgraph.json``; return (command, environment,
    working dir)."""
    check_installed()
    load_graph_file(settings.graph)  # a broken file fails here, with verlog's clear message
    check_port(settings)
    folder = state_dir_for(settings)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "langgraph.json"
    config_path.write_text(json.dumps(langgraph_config(settings), indent=2) + "\n")
    return langgraph_dev_command(settings, config_path), server_environment(settings), folder


def serve_graph(settings: GraphServeSettings, announce: Callable[[Path], None] | None = None) -> int:
    """Run the graph behind ``langgraph dev`` in the foreground; return its exit code.

    ``announce(state_dir)`` is called once the graph file has loaded, before the server starts.
    On POSIX the process becomes the server (``exec``), so signals (Ctrl-C, a supervisor's
    SIGTERM) reach it directly and no orphan is left behind; elsewhere it runs as a child.
    """
    cmd, env, folder = prepare(settings)
    if announce is not None:
        announce(folder)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":
        os.chdir(folder)
        os.execve(cmd[0], cmd, env)  # does not return
    process = subprocess.Popen(cmd, env=env, cwd=folder)
    try:
        return process.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C: let it shut down
        try:
            return process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            return 130
