"""Test helper: run a ``verlog`` command in this process, through ``verlog.cli.main``, as a user's
shell would see it (exit status, stdout, stderr), without a fresh interpreter's 6-7 s of imports.

Each command keeps one real subprocess smoke test (``tests/test_cli.py``); the other CLI checks go
through :func:`run_cli`. What a command changes process-wide (torch's thread count, the working
folder, the console's width) is put back afterwards, so a later test sees the process as it was."""

from __future__ import annotations

import io
import os
import sys
from contextlib import chdir, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the width a subprocess test gets through ``COLUMNS=200`` (rich wraps at 80 otherwise)
WIDTH = 200


@dataclass
class CliResult:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would have returned."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, stdin: str = "", cwd: Path = ROOT) -> CliResult:
    """``verlog ARGS...`` in this process; ``SystemExit`` (argparse's errors, ``--help``) becomes
    the exit status, as it would for a shell."""
    import torch

    from verlog.cli import main
    from verlog.console import console, error_console

    out, err = io.StringIO(), io.StringIO()
    threads, widths = torch.get_num_threads(), (console.width, error_console.width)
    stdin_before, environ = sys.stdin, dict(os.environ)
    sys.stdin = io.StringIO(stdin)
    console.width = error_console.width = WIDTH
    try:
        with chdir(cwd), redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
    finally:
        sys.stdin = stdin_before
        console.width, error_console.width = widths
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
    return CliResult(int(code or 0), out.getvalue(), err.getvalue())
