"""The live display of an evaluation: one progress bar per environment and one for the whole run,
each with the mean progression of the episodes finished so far."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from verlog.evaluation.results import EpisodeRecord

__all__ = ["EvalProgress"]


class EvalProgress:
    """Progress bars fed with finished episodes (``add``); use as a context manager.

    ``totals``: episodes planned per environment; ``finished``: records already on disk (they
    start the bars where the previous run stopped).
    """

    def __init__(self, console: Console, totals: Mapping[str, int], finished: Iterable[EpisodeRecord] = ()):
        self.progress = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("progression {task.fields[score]:>5}"),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._scores: dict[str, list[float]] = {name: [] for name in totals}
        self._failed: dict[str, int] = {name: 0 for name in totals}
        self._bars: dict[str, Any] = {}
        names = list(totals) + (["all"] if len(totals) > 1 else [])
        for name in names:
            total = sum(totals.values()) if name == "all" else totals[name]
            self._bars[name] = self.progress.add_task(name, total=total, score="-", failed=0)
        for record in finished:
            self.add(record)

    def add(self, record: EpisodeRecord) -> None:
        """Count one finished episode."""
        env = record.env
        self._scores.setdefault(env, []).append(record.progression)
        self._failed[env] = self._failed.get(env, 0) + int(record.failed)
        for name in (env, "all"):
            if name not in self._bars:
                continue
            scores = self._scores[env] if name == env else [x for xs in self._scores.values() for x in xs]
            failed = self._failed[env] if name == env else sum(self._failed.values())
            self.progress.update(self._bars[name], advance=1, score=f"{sum(scores) / len(scores):.1f}", failed=failed)

    def __enter__(self) -> "EvalProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()
