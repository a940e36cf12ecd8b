"""Where verlog keeps what it builds once and reuses (models, generated games, servers' folders).

Its own module, beside every package that caches something, so that none of them imports another
only for this folder (the environments would otherwise import the models, which import them)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["verlog_cache_dir"]


def verlog_cache_dir() -> Path:
    """The folder where verlog caches built artefacts (models...): ``$VERLOG_CACHE`` if set,
    else ``~/.cache/verlog``. Not created here."""
    env = os.environ.get("VERLOG_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verlog"
