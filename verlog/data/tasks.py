"""What an episode plays: a seed (``make_input(seed)``, the games) or a dataset row.

Episodes are numbered: the ``i``-th task of a source. ``SeedTasks`` makes task ``i`` from seed
``first + i``; ``RowTasks`` plays row ``order(i)`` of a split. For training, ``EpochOrder`` walks
the rows in shuffled epochs: task ``i`` is in epoch ``i // n`` and plays that epoch's permutation
at ``i % n``, so every row is played once per epoch, and the position in the epoch follows from
how many tasks were started (what a checkpoint saves). Validation and test tasks play their
split's rows in file order, each once.

``load_tasks(config, graph_file, split)`` builds the source a command needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from verlog.config import DataSourceConfig, EpisodeSources, SplitName
from verlog.data.files import DataError, Rows, read_rows, row_digest
from verlog.data.inputs import input_maker
from verlog.graph_file import GraphFile

__all__ = [
    "EpochOrder",
    "RowTasks",
    "SeedTasks",
    "Task",
    "TaskSource",
    "load_tasks",
    "shared_rows",
    "split_rows",
]


@dataclass(frozen=True)
class Task:
    """What one episode plays: its ``key`` (the seed, or the row's index in its split), the
    graph ``input``, and the dataset ``row`` (``None`` for a seed-made episode)."""

    key: int
    input: Any
    row: dict[str, Any] | None = None


class EpochOrder:
    """Shuffled epochs over ``n`` rows: ``row_index(i)`` is the row of the ``i``-th task.

    Epoch ``e`` visits the rows in a permutation drawn from ``(seed, e)`` (numpy's PCG64), or in
    file order without ``shuffle``."""

    def __init__(self, n: int, *, seed: int = 0, shuffle: bool = True):
        if n < 1:
            raise ValueError("an epoch needs at least one row")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._recent: dict[int, list[int]] = {}  # the last few epochs' orders

    def permutation(self, epoch: int) -> list[int]:
        """The order of epoch ``epoch``."""
        if not self.shuffle:
            return list(range(self.n))
        if epoch not in self._recent:
            import numpy as np

            if len(self._recent) >= 4:
                self._recent.pop(min(self._recent))
            self._recent[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n).tolist()
        return self._recent[epoch]

    def row_index(self, i: int) -> int:
        return self.permutation(i // self.n)[i % self.n]

    def epoch(self, i: int) -> float:
        """How far task ``i`` is into the run, in epochs (``1.5``: half-way through the second)."""
        return i / self.n


class SeedTasks:
    """Tasks made by a graph file's ``make_input(seed)``: task ``i`` is seed ``first + i``."""

    size: int | None = None

    def __init__(self, make_input: Callable[[int], Any], first: int = 0):
        self.make_input, self.first = make_input, first

    def key(self, i: int) -> int:
        return self.first + i

    def task(self, i: int) -> Task:
        seed = self.first + i
        return Task(seed, self.make_input(seed))

    def row(self, i: int) -> None:
        return None


class RowTasks:
    """Tasks playing the rows of a split: task ``i`` is row ``order.row_index(i)`` (training, in
    epochs), or row ``i`` without an order (evaluation: each row once)."""

    def __init__(self, rows: Rows, to_input: Callable[[dict[str, Any]], Any], order: EpochOrder | None = None):
        self.rows, self.to_input, self.order = rows, to_input, order

    @property
    def size(self) -> int:
        return len(self.rows)

    def key(self, i: int) -> int:
        """The index in the split of the row task ``i`` plays."""
        return self.order.row_index(i) if self.order is not None else i

    def row(self, i: int) -> dict[str, Any]:
        return self.rows[self.key(i)]

    def task(self, i: int) -> Task:
        index = self.key(i)
        row = self.rows[index]
        return Task(index, self.to_input(row), row)


TaskSource = SeedTasks | RowTasks


@functools.lru_cache(maxsize=16)
def _cached_rows(source_json: str, split: str) -> Rows:
    return read_rows(DataSourceConfig.model_validate_json(source_json), split)


def split_rows(config: EpisodeSources, split: str) -> Rows:
    """The rows of ``data.<split>`` (read once per process); ``DataError`` when it is not set."""
    if config.data is None:
        raise DataError(f"data.{split} is not set: this config has no data section")
    source = config.data.split(split)
    if source is None:
        raise DataError(f"data.{split} is not set: give the {split} split's file (data.{split}: path/to/rows.jsonl)")
    return _cached_rows(source.model_dump_json(), split)


def load_tasks(
    config: EpisodeSources,
    graph_file: GraphFile,
    split: SplitName = "train",
    *,
    first_seed: int = 0,
    in_order: bool = False,
) -> TaskSource:
    """The tasks of ``split`` for ``graph_file``: its dataset rows when the config has a data
    section (training rows in shuffled epochs unless ``in_order``), else seeds from ``first_seed``
    (``make_input(seed)``)."""
    if config.data is None or not config.data.has_rows():  # no rows (traces alone)
        return SeedTasks(graph_file.episode_input, first_seed)
    rows = split_rows(config, split)
    to_input = input_maker(graph_file, config.data.input, rows.columns, split)
    epochs = split == "train" and not in_order
    order = EpochOrder(len(rows), seed=config.data.seed, shuffle=config.data.shuffle) if epochs else None
    return RowTasks(rows, to_input, order)


def shared_rows(a: Rows, b: Rows) -> int:
    """How many rows of ``b`` have the same content as some row of ``a`` (a test split that
    shares rows with the training split measures memory, not skill)."""
    seen = {row_digest(row) for row in a}
    return sum(row_digest(row) in seen for row in b)
