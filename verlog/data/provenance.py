"""What a training run's data splits held when it began, so that ``--resume`` can tell a changed file.

A run records, beside its ``config.yaml``, a digest of each configured split's files
(``data_files.json``: the files' names and bytes, and the rows taken from them: ``split``,
``limit``). ``verlog train --resume`` compares the splits as they are now with that record: a split
whose content changed would train on other rows than the run's epochs were drawn over, so it is
refused, naming the split, its file and what changed. A file moved elsewhere with the same
content is the same split.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from verlog.config import SPLITS, ConfigError, VerlogConfig
from verlog.data.files import source_files

__all__ = ["DATA_FILES_RECORD", "check_same_data", "data_files_record", "write_data_files_record"]

#: the record's file name in a run folder
DATA_FILES_RECORD = "data_files.json"


def _content(path: str) -> tuple[str, int]:
    """The SHA-256 of a file or folder (every file below it, by relative name and bytes) and its size."""
    digest, size = hashlib.sha256(), 0
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        digest.update(str(file.relative_to(root) if root.is_dir() else file.name).encode() + b"\0")
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        digest.update(b"\0")
    return digest.hexdigest(), size


def data_files_record(config: VerlogConfig) -> dict[str, dict[str, Any]]:
    """Each configured split's path, its files' digest and size, and the rows taken (split, limit)."""
    record: dict[str, dict[str, Any]] = {}
    for name in SPLITS:
        source = config.data.split(name) if config.data is not None else None
        if source is None:
            continue
        digest, size = hashlib.sha256(), 0
        for path in source_files(source):
            if not Path(path).exists():
                continue  # (reading the split says so)
            content, nbytes = _content(path)
            digest.update(content.encode())
            size += nbytes
        record[name] = {
            "path": source.path,
            "sha256": digest.hexdigest(),
            "bytes": size,
            "split": source.split,
            "limit": source.limit,
        }
    return record


def write_data_files_record(run_dir: Path, config: VerlogConfig) -> None:
    """Record the splits ``config`` trains and evaluates on in ``run_dir``."""
    (run_dir / DATA_FILES_RECORD).write_text(json.dumps(data_files_record(config), indent=1))


def check_same_data(run_dir: Path, config: VerlogConfig) -> None:
    """``ConfigError`` (one line) when a split differs from what the run in ``run_dir`` recorded:
    other content, other rows taken, or a split added or removed. A run without a record (an
    older verlog) is not checked."""
    path = run_dir / DATA_FILES_RECORD
    try:
        then = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    now = data_files_record(config)
    for name in SPLITS:
        before, after = then.get(name), now.get(name)
        if before == after or (before and after and _same_rows(before, after)):
            continue
        if before is None or after is None:
            what = (
                f"the run had none, now {after['path']!r}"
                if before is None
                else f"the run had {before['path']!r}, now none"
            )
        elif before["sha256"] != after["sha256"]:
            what = (
                f"{after['path']!r} holds other content than the run's {before['path']!r} "
                f"(sha256 {before['sha256'][:12]} then, {after['sha256'][:12]} now; {before['bytes']:,} bytes then, "
                f"{after['bytes']:,} now)"
            )
        else:
            what = f"other rows of {after['path']!r} (split {before['split']!r}, limit {before['limit']} then; split {after['split']!r}, limit {after['limit']} now)"
        raise ConfigError(
            f"data.{name}: changed since the run in {str(run_dir)!r} began: {what}; resume with the run's own data "
            "(restore the file), or start a new run in another trainer.run_dir"
        )


def _same_rows(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """The same content and the same rows taken of it (the path may differ: a moved file)."""
    return all(before[k] == after[k] for k in ("sha256", "split", "limit"))
