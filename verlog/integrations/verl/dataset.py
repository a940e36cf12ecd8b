"""verl's dataset for a verlog run: rows that name env slots or validation episodes, not prompts.

verl drives rollouts from a dataset: every step it takes ``data.train_batch_size`` rows and runs
one agent loop per row. A verlog graph makes its own prompts, so its rows only say *what* to
play. The launcher points verl at this class (``data.custom_cls``) with

* ``data.train_files: verlog://slots/<num_envs>?source=<name>``: row ``i`` is env slot ``i``; with
  ``data.train_batch_size = num_envs`` and no shuffling every step dispatches every slot once,
  in the same order (so each slot stays on the same agent-loop worker);
* ``data.val_files: verlog://episodes/<eval_episodes>?source=<name>``: row ``i`` is validation
  episode ``i`` (seed ``verlog.eval_seed + i``).

``source`` becomes the rows' ``data_source``, the name verl's validation metrics are grouped by.

A slot row also carries, in ``extra_info.verlog_episodes_started``, how many episodes each of
its sessions had started by the last step the trainer saw (``VerlogRows.episodes_started``,
restored from a checkpoint on resume), and in ``extra_info.verlog_in_flight`` the round each had
in flight then (``VerlogRows.in_flight``): a slot created afresh (after a resume, or on another
worker) first plays that episode again, whole, then goes on with the next seeds instead of
replaying its first ones.

Importing this module where verl is installed also registers verlog's agent loop
(``verlog_langgraph``) with verl: verl's agent-loop workers load the dataset class
(``data.custom_cls``) when they start, so every worker, on every node, knows the agent loop
by its package name (no file path to share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence
from urllib.parse import parse_qs, urlparse

import torch
from torch.utils.data import Dataset

from verlog.integrations.verl.settings import AGENT_NAME

__all__ = ["RowsSpec", "VerlogRows", "rows_uri"]

SCHEME = "verlog"
Role = Literal["slots", "episodes"]
#: the role named in the URI -> ``extra_info.verlog_role`` of its rows
_ROW_ROLE = {"slots": "slot", "episodes": "episode"}


def rows_uri(role: Role, count: int, source: str = "verlog") -> str:
    """The ``data.*_files`` value that makes ``VerlogRows`` yield ``count`` rows of ``role``."""
    return f"{SCHEME}://{role}/{int(count)}?source={source}"


@dataclass(frozen=True)
class RowsSpec:
    """What a ``verlog://`` data file names."""

    role: Role
    count: int
    source: str

    @classmethod
    def parse(cls, uri: str) -> "RowsSpec":
        parsed = urlparse(str(uri))
        parts = [p for p in parsed.path.split("/") if p]
        if parsed.scheme != SCHEME or parsed.netloc not in _ROW_ROLE or len(parts) != 1 or not parts[0].isdigit():
            raise ValueError(
                f"data file {uri!r} is not a verlog row set: expected {rows_uri('slots', 32)!r} "
                f"or {rows_uri('episodes', 32)!r}"
            )
        source = parse_qs(parsed.query).get("source", ["verlog"])[0]
        return cls(role=parsed.netloc, count=int(parts[0]), source=source)  # type: ignore[arg-type]


class VerlogRows(Dataset):
    """The rows of a ``verlog://`` data file (signature of verl's ``RLHFDataset``)."""

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: Any = None,
        processor: Any = None,
        config: Any = None,
        max_samples: int = -1,
    ):
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        if len(files) != 1:
            raise ValueError(f"verlog's dataset takes one verlog:// data file, got {files}")
        self.spec = RowsSpec.parse(files[0])
        self.count = self.spec.count if max_samples is None or max_samples < 0 else min(self.spec.count, max_samples)
        #: episodes started per env slot, by ``"{index}:{session}"`` (kept up to date by the trainer)
        self.episodes_started: dict[str, int] = {}
        #: the round each env slot had in flight at its latest report, by the same keys (``None``: none)
        self.in_flight: dict[str, int | None] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        role = _ROW_ROLE[self.spec.role]
        extra: dict[str, Any] = {"index": index, "verlog_role": role}
        if role == "slot":
            extra["verlog_episodes_started"] = {
                key.split(":", 1)[1]: int(n)
                for key, n in self.episodes_started.items()
                if key.split(":", 1)[0] == str(index)
            }
            extra["verlog_in_flight"] = {
                key.split(":", 1)[1]: round_
                for key, round_ in self.in_flight.items()
                if key.split(":", 1)[0] == str(index) and round_ is not None
            }
        return {
            # verl logs and counts ``raw_prompt``; the graph makes the real prompts
            "raw_prompt": [{"role": "user", "content": f"verlog {role} {index}"}],
            "data_source": self.spec.source,
            "agent_name": AGENT_NAME,
            "index": index,
            "extra_info": extra,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }


def _register_agent_loop() -> None:
    """Register verlog's agent loop with verl, when verl is installed (see the module docstring)."""
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        return
    import verlog.integrations.verl.agent_loop  # noqa: F401  (``@register("verlog_langgraph")``)


_register_agent_loop()
