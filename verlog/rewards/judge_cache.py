"""Judges' verdicts kept by what defines them, in memory and in a JSONL file, so none is paid twice.

A verdict's key is a digest of everything that decides it: the judge's kind, model and sampling
settings, the schema it answers under and the exact messages it is sent (which hold the rubric,
the reference answer and the transcripts). The file is append-only, one ``{"key", "value"}``
line per verdict, flushed as it is written; reading skips a line that does not parse (the cut
last line of a run that was killed mid-write), and appending after such a line starts a new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

__all__ = ["VerdictCache", "verdict_key"]

log = logging.getLogger(__name__)

#: bump when what a cached value means changes (older lines then simply miss)
CACHE_FORMAT = 1


def verdict_key(**defining: Any) -> str:
    """The digest of everything that defines a verdict (JSON-serializable values)."""
    blob = json.dumps({"format": CACHE_FORMAT, **defining}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class VerdictCache:
    """Verdicts by key: in memory, and appended to ``path`` when one is given.

    Args:
        path: the JSONL file (created with its folder on the first verdict); ``None``: memory only.
    """

    def __init__(self, path: Path | None = None):
        self.path = path
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.skipped_lines = 0
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        with path.open("r", encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    self._values[entry["key"]] = entry["value"]
                except (ValueError, KeyError, TypeError):
                    self.skipped_lines += 1
        if self.skipped_lines:
            log.warning("%s: skipped %d unreadable line(s) (a write cut short?)", path, self.skipped_lines)

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: str) -> Any | None:
        """The value kept under ``key``, or ``None``."""
        return self._values.get(key)

    def put(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key`` (and append it to the file)."""
        with self._lock:
            self._values[key] = value
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n"
            with self.path.open("a+b") as f:
                if f.tell() > 0:  # a cut last line must not swallow this one
                    f.seek(-1, 2)
                    if f.read(1) != b"\n":
                        line = "\n" + line
                f.write(line.encode("utf-8"))
                f.flush()
