"""What episodes play and how they are scored: a config's tasks and its ``reward`` section.

``EpisodePlan`` joins the two for one split, as every runner needs them: episode ``i`` plays
``plan.input(i)`` (a seed's ``make_input(seed)``, or a dataset row turned into the graph's input)
and, once it has ended well, ``await plan.score(episode, i)`` runs the reward functions and judges
on it and adds their rewards to its turns. The trainer, ``verlog eval`` and ``verlog rollout``
all use it, so an episode is scored the same way wherever it is played.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from verlog.config import SPLITS, EpisodeSources, SplitName
from verlog.data import TaskSource, load_tasks, split_rows
from verlog.graph_file import GraphFile
from verlog.rewards import Outcome, RewardScorer, Trajectory

__all__ = ["EpisodePlan", "build_scorer"]


def build_scorer(
    config: EpisodeSources, *, cache_dir: Path | None = None, chat_model_for: Callable[[str], Any] | None = None
) -> RewardScorer | None:
    """The config's ``reward`` section, checked against the training rows' columns and, for
    endpoint judges, against their servers (``None`` when it is empty)."""
    if config.reward.empty:
        return None
    scorer = RewardScorer(config.reward, cache_dir=cache_dir, chat_model_for=chat_model_for)
    columns: list[str] = []
    if config.data is not None:
        for split in SPLITS:
            if config.data.split(split) is not None:
                columns = split_rows(config, split).columns
                break
    scorer.check_arguments(columns)
    scorer.check_judges()
    return scorer


class EpisodePlan:
    """The tasks of ``split`` and the scorer of their episodes.

    ``keep_trajectories``: keep each scored episode's ``Trajectory`` and task until
    ``take_trajectories`` (the trainer's ranking judges score a batch's groups from them).
    ``in_order``: the training rows in file order, each once (``verlog rollout``), not in epochs."""

    def __init__(
        self,
        config: EpisodeSources,
        graph_file: GraphFile,
        split: SplitName = "train",
        *,
        first_seed: int = 0,
        scorer: RewardScorer | None = None,
        keep_trajectories: bool = False,
        in_order: bool = False,
    ):
        self.config, self.split = config, split
        self.tasks: TaskSource = load_tasks(config, graph_file, split, first_seed=first_seed, in_order=in_order)
        self.scorer = scorer
        self.keep_trajectories = keep_trajectories
        self._kept: dict[str, tuple[int, Trajectory]] = {}

    @property
    def size(self) -> int | None:
        """How many distinct tasks there are (a split's rows), ``None`` for seeds."""
        return self.tasks.size

    def input(self, i: int) -> Any:
        """The graph input of episode ``i``."""
        return self.tasks.task(i).input

    def key(self, i: int) -> int:
        """The seed of episode ``i``, or the index of its row in the split."""
        return self.tasks.key(i)

    def trajectory(self, episode: Any, i: int, *, info: dict[str, Any] | None = None) -> Trajectory:
        """What reward functions see of ``episode`` (a ``verlog.rollout.Episode``), played as task ``i``."""
        return Trajectory(
            state=episode.output,
            row=self.tasks.row(i),
            key=self.tasks.key(i),
            turns=list(episode.turns),
            info=dict(info if info is not None else episode.info),
            episode_id=episode.episode_id,
        )

    async def outcome(self, episode: Any, i: int, *, info: dict[str, Any] | None = None) -> Outcome | None:
        """The external rewards of ``episode`` (``None`` without a reward section); raises
        ``RewardError`` when a reward function or judge fails."""
        if self.scorer is None:
            return None
        trajectory = self.trajectory(episode, i, info=info)
        outcome = await self.scorer.score(trajectory)
        if self.keep_trajectories:
            self._kept[episode.episode_id] = (i, trajectory)
        return outcome

    async def score(self, episode: Any, i: int) -> None:
        """Score ``episode`` (task ``i``) and add the outcome to its turns (a runner's
        ``on_episode_end``)."""
        outcome = await self.outcome(episode, i)
        if outcome is not None:
            outcome.apply(episode)

    def take_trajectories(self, episode_ids: list[str]) -> dict[str, tuple[int, Trajectory]]:
        """The kept ``(task, trajectory)`` of these episodes, forgotten here."""
        return {e: self._kept.pop(e) for e in episode_ids if e in self._kept}
