"""Reading a split's rows from disk with the ``datasets`` library.

A split is a JSONL/JSON, Parquet or CSV file (or a glob of them), or a folder written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``. Every row comes back as a plain dict
(nested columns as lists and dicts), in file order. Errors name the split, the path and what to
change (``DataError``, a ``ConfigError``: one ``error:`` line on the command line).
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from verlog.config import ConfigError, DataSourceConfig

__all__ = ["DataError", "Rows", "read_rows", "row_digest", "source_files"]

#: file suffixes and the ``datasets`` builder that reads them
_SUFFIX_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ConfigError):
    """A data split cannot be read or used as configured; the message names the split and key."""


@dataclass
class Rows:
    """The rows of one split: ``rows[i]`` is a plain dict. ``source`` says where they came from."""

    split: str
    source: str
    dataset: Any  # a ``datasets.Dataset``

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self.dataset):
            raise IndexError(f"{self.split} has {len(self.dataset)} rows, no row {index}")
        return dict(self.dataset[int(index)])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    @property
    def columns(self) -> list[str]:
        return list(self.dataset.column_names)


def row_digest(row: dict[str, Any]) -> str:
    """A digest of a row's content (the same row in two splits has the same digest)."""
    return hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()


def source_files(source: DataSourceConfig) -> list[str]:
    """The files a split names: its path, or the files its glob matches, in name order (a
    datasets folder is its path)."""
    return sorted(glob.glob(source.path)) if any(c in source.path for c in "*?[") else [source.path]


def _format(source: DataSourceConfig, split: str) -> str:
    if source.format != "auto":
        return source.format
    path = Path(source.path)
    if path.is_dir():
        return "disk"
    suffix = path.suffix.lower()
    if suffix not in _SUFFIX_FORMATS:
        raise DataError(
            f"data.{split}.format: cannot tell the format of {source.path!r} from its suffix; set it to one of "
            "json (also JSONL), parquet, csv, disk (a save_to_disk folder)"
        )
    return _SUFFIX_FORMATS[suffix]


def read_rows(source: DataSourceConfig, split: str) -> Rows:
    """The rows of ``source`` (the config of ``split``), read with ``datasets``."""
    import datasets

    fmt = _format(source, split)
    where = f"data.{split}.path"
    if fmt == "disk":
        if not Path(source.path).is_dir():
            raise DataError(f"{where}: {source.path!r} is not a folder written by datasets' save_to_disk")
        try:
            loaded = datasets.load_from_disk(source.path, keep_in_memory=True)
        except (FileNotFoundError, ValueError) as exc:
            raise DataError(f"{where}: {source.path!r} is not a datasets folder: {exc}") from None
        if isinstance(loaded, datasets.DatasetDict):
            names = sorted(loaded)
            if source.split is None:
                if len(names) != 1:
                    raise DataError(
                        f"data.{split}.split: {source.path!r} holds the splits {', '.join(names)}; name one"
                    )
                dataset = loaded[names[0]]
            elif source.split not in loaded:
                raise DataError(
                    f"data.{split}.split: {source.split!r} is not in {source.path!r} (it has {', '.join(names)})"
                )
            else:
                dataset = loaded[source.split]
        else:
            if source.split is not None:
                raise DataError(f"data.{split}.split: {source.path!r} holds one dataset, not splits; remove the key")
            dataset = loaded
    else:
        files = source_files(source)
        missing = [f for f in files if not Path(f).is_file()]
        if not files or missing:
            raise DataError(f"{where}: no such file {(missing or [source.path])[0]!r}")
        if source.split is not None:
            raise DataError(f"data.{split}.split: only a datasets folder has splits; {source.path!r} is a file")
        empty = [f for f in files if Path(f).stat().st_size < 4096 and not Path(f).read_bytes().strip()]
        if empty:
            raise DataError(f"{where}: {empty[0]!r} is empty: a split needs at least one row")
        try:
            with _quiet():
                dataset = datasets.load_dataset(fmt, data_files=files, split="train", keep_in_memory=True)
        except Exception as exc:  # datasets raises many kinds for a malformed file
            problem_of = {"json": json_problem, "csv": csv_problem}.get(fmt)
            bad = next((problem for f in files if problem_of and (problem := problem_of(f))), None)
            cause = exc
            while cause.__cause__ is not None:  # datasets wraps the reader's own error: say that one
                cause = cause.__cause__
            detail = bad or "; ".join(str(cause).strip().splitlines()[:2]) or type(cause).__name__
            raise DataError(f"{where}: {source.path!r} could not be read as {fmt}: {detail}") from None
    if source.limit is not None:
        dataset = dataset.select(range(min(source.limit, len(dataset))))
    if len(dataset) == 0:
        raise DataError(f"{where}: {source.path!r} has no rows")
    return Rows(split=split, source=source.path, dataset=dataset)


def json_problem(path: str) -> str | None:
    """Where a JSON or JSONL file is malformed, as ``file:line:column: what`` (``None`` when every
    line of a JSONL file, or the whole JSON file, parses)."""
    text = Path(path).read_text(errors="replace")
    try:
        json.loads(text)
        return None  # one JSON document
    except json.JSONDecodeError as whole:
        first_error = whole
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == 1 and line.lstrip().startswith("["):  # a JSON array over many lines
                return f"{path}:{first_error.lineno}:{first_error.colno}: not valid JSON: {first_error.msg}"
            return f"{path}:{number}:{exc.colno}: not valid JSON: {exc.msg}"
        if not isinstance(value, dict):
            return f'{path}:{number}: a JSONL row must be a JSON object ({{"column": value, ...}}), got {type(value).__name__}'
    return None


def csv_problem(path: str) -> str | None:
    """Where a CSV file cannot be read as rows, as ``file:line: what`` (bytes that are not UTF-8, a
    quoted field never closed, a row with more fields than the header); ``None`` when every row
    reads."""
    import csv

    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); save the file as UTF-8"
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    started = 1  # the line the row being read began on
    try:
        for row in reader:
            if header is None:
                header = row
            elif len(row) > len(header):  # (a shorter row reads, its last columns empty)
                return (
                    f"{path}:{started}: {len(row)} fields, but the header names {len(header)} "
                    f"({', '.join(header)}): quote a field holding a comma"
                )
            started = reader.line_num + 1
    except csv.Error as exc:
        unclosed = "EOF" in str(exc) or "unexpected end of data" in str(exc)
        what = "a quoted field is never closed (a stray double quote?)" if unclosed else str(exc)
        return f"{path}:{started}: {what}"
    return None


class _quiet:
    """``datasets``' progress bars off inside the block."""

    def __enter__(self) -> None:
        import datasets

        self._were_on = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()

    def __exit__(self, *exc: Any) -> None:
        import datasets

        if self._were_on:
            datasets.enable_progress_bars()
