"""The terminal the command-line tools write to: ``console`` for output, ``print_error`` for a
user's mistake (one ``error: <message>`` line on stderr). Shared by ``verlog.cli`` and the
commands other packages add to it, so none of them imports the CLI module."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

__all__ = ["console", "error_console", "print_error"]

console = Console(highlight=False)
if not console.is_terminal:  # a log file or a pipe: lines never wrapped, tables 160 wide (rich assumes 80)
    console.soft_wrap = True
    console.width = max(console.width, 160)
#: where ``error:`` lines go; soft_wrap keeps a long message on one line
error_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """Report a user's mistake: ``error: <message>`` on stderr (brackets in it are kept)."""
    error_console.print(f"[red]error:[/] {escape(message)}")
