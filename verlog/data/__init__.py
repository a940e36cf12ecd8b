"""Task data: the dataset rows episodes play, read from files, split and ordered.

* ``files``  — reading a split (JSONL, Parquet, CSV, a ``datasets`` folder) with ``datasets``
* ``inputs`` — a row as a graph input (``make_input(row)`` or the ``data.input`` column mapping)
* ``tasks``  — what episode ``i`` plays: a seed or a row; shuffled epochs over the training rows
* ``provenance`` — what a run's splits held when it began (``--resume`` refuses a changed file)
"""

from verlog.data.files import DataError, Rows, read_rows, row_digest
from verlog.data.inputs import input_maker, makes_input_from_row, messages_input
from verlog.data.tasks import (
    EpochOrder,
    RowTasks,
    SeedTasks,
    Task,
    TaskSource,
    load_tasks,
    shared_rows,
    split_rows,
)

__all__ = [
    "DataError",
    "EpochOrder",
    "RowTasks",
    "Rows",
    "SeedTasks",
    "Task",
    "TaskSource",
    "input_maker",
    "load_tasks",
    "makes_input_from_row",
    "messages_input",
    "read_rows",
    "row_digest",
    "shared_rows",
    "split_rows",
]
