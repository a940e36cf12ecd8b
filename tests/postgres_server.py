"""Test helper: a PostgreSQL server of this machine's, started in a temporary folder (the trace
store's and ``verlog serve --postgres-uri``'s tests); skipped where none is installed or it does
not start, except under ``VERLOG_REQUIRE_POSTGRES=1`` (``make test`` sets it once
``scripts/ensure_postgres.sh`` has found or installed one: CI), where that fails the test."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from langgraph_server import free_port


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def _unavailable(reason: str) -> None:
    if os.environ.get("VERLOG_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"VERLOG_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@contextmanager
def running_postgres() -> Iterator[str]:
    """Start a PostgreSQL server; yield its URL; stop it and remove its folder."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if not initdb or not pg_ctl:
        _unavailable("no PostgreSQL server installed here (initdb, pg_ctl)")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="verlog-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    try:
        subprocess.run(
            [*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "verlog"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                *as_user,
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(folder / "log"),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {port} -k {folder} -c listen_addresses=127.0.0.1",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        _unavailable(f"PostgreSQL does not start here: {exc}")
    try:
        yield f"postgresql://verlog@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
