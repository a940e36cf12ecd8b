"""`verlog serve --postgres-uri`: threads kept in a team's Postgres, shared by server processes.

Two `verlog serve` processes on one Postgres (a real PostgreSQL server started for the module;
skipped where none is installed, as on CI). An episode runs on the first; the first is killed
with SIGKILL mid-episode; the second, which was already running, continues that thread from the
checkpoint in Postgres, and it ends as the uninterrupted episode of the same seed.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.postgres")
pytest.importorskip("langgraph_api")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

from langgraph_server import ROOT, SlowCountingEngine, free_port, serve_command, server_process  # noqa: E402

from verlog.backends.embedded import EmbeddedEngine  # noqa: E402
from verlog.serve import OpenAIServer, serve_in_thread  # noqa: E402


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@pytest.fixture(scope="module")
def postgres_uri():
    """A PostgreSQL server of this machine's, started in a temporary folder for the module."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("no PostgreSQL server installed here (initdb, pg_ctl)")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="verlog-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "verlog"], check=True,
                       capture_output=True, timeout=120)
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "60", "-o",
                        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                       check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"PostgreSQL does not start here: {exc}")
    try:
        yield f"postgresql://verlog@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def slow_endpoint(tiny_model, tiny_tokenizer):
    engine = SlowCountingEngine(EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0), delay_s=0.25)
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        yield base_url
    engine.inner.close()


async def test_a_second_server_continues_a_killed_servers_thread_from_postgres(postgres_uri, slow_endpoint, tmp_path):
    cap = 30
    env = {**os.environ, "VERLOG_API_KEY": "", "VERLOG_POSTGRES_URI": postgres_uri}
    first_port, second_port = free_port(), free_port()
    first = serve_command(slow_endpoint, first_port, tmp_path / "first", max_steps=cap)
    second = serve_command(slow_endpoint, second_port, tmp_path / "second", max_steps=cap)
    with server_process(second, env, ROOT, second_port, tmp_path / "second.log") as (second_url, _):
        with server_process(first, env, ROOT, first_port, tmp_path / "first.log") as (first_url, process):
            client = langgraph_sdk.get_client(url=first_url)
            thread_id = (await client.threads.create())["thread_id"]
            await client.runs.create(thread_id, "babyai", input={"seed": 4})
            while True:
                values = (await client.threads.get_state(thread_id))["values"]
                if values and values.get("steps", 0) >= 5:
                    break
                await asyncio.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        assert "Postgres" in (tmp_path / "first.log").read_text()
        client = langgraph_sdk.get_client(url=second_url)
        # the second server never saw this thread: it takes it from Postgres and goes on
        resumed = await client.runs.wait(thread_id, "babyai", input=None, if_not_exists="create")
        whole = await client.runs.wait((await client.threads.create())["thread_id"], "babyai", input={"seed": 4})
    assert "__error__" not in resumed, resumed
    assert resumed["steps"] == cap
    for key in ("seed", "steps", "episode_return", "observation", "actions", "history"):
        assert resumed[key] == whole[key], key
