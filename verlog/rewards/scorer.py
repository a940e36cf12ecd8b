"""``RewardScorer``: the ``reward`` section of a config, run on finished episodes.

Per episode (``score``), once it has ended well: every reward function and every rubric judge,
concurrently; their rewards are weighted and summed (``Outcome``). Per group (``rank``), at the
batch boundary: every ranking judge on the episodes of one task that ended in the batch. An
``Outcome`` is then added to the episode (``apply``): its reward on the last turn (where the
environment's own final reward sits), per-turn rewards on their turns, ``success`` and each
component (``reward/<name>``, unweighted) in the last turn's info. Rewards the graph reported
itself (``areport_reward``) stay: the external ones add to them.

Success: the ``success`` of every function or judge that reports one, and of the graph's own
info when it has one, must all hold; ``None`` when nobody says.

A component that fails (raises, times out, returns nonsense) fails the whole episode
(``RewardError``): it is dropped from training and counted as errored in evaluations, never
given a made-up reward.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from verlog.config import RewardConfig
from verlog.rewards.functions import RewardError, RewardFunction
from verlog.rewards.result import RewardResult, Trajectory
from verlog.rollout.slots import SlotFailureError
from verlog.step_info import SUCCESS_KEY  # re-exported: the info key an episode's success is read from

__all__ = ["COMPONENT_PREFIX", "Outcome", "RewardScorer", "SUCCESS_KEY", "component_key"]

#: info keys of reward components start with it (also their metrics' names)
COMPONENT_PREFIX = "reward/"


def component_key(name: str) -> str:
    """The info key of one reward component's (unweighted) value."""
    return COMPONENT_PREFIX + name


@dataclass
class Outcome:
    """The external rewards of one episode: the weighted sum, per-turn rewards, success and the
    unweighted value of each component."""

    reward: float = 0.0
    turn_rewards: list[float] | None = None
    success: bool | None = None
    components: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, weight: float, result: RewardResult) -> None:
        """Fold one component's verdict in."""
        self.reward += weight * result.reward
        self.components[name] = result.reward
        if result.turn_rewards is not None:
            base = self.turn_rewards or [0.0] * len(result.turn_rewards)
            self.turn_rewards = [b + weight * r for b, r in zip(base, result.turn_rewards)]
        if result.success is not None:
            self.success = result.success if self.success is None else self.success and result.success
        self.info.update(result.info)

    def merge_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """``info`` (what the graph reported) with this outcome's info, components and success."""
        merged = {**info, **self.info, **{component_key(k): v for k, v in self.components.items()}}
        if self.success is not None:
            own = info.get(SUCCESS_KEY)
            merged[SUCCESS_KEY] = self.success if own is None else bool(own) and self.success
        return merged

    def apply(self, episode: Any) -> None:
        """Add the outcome to ``episode`` (a ``verlog.rollout.Episode``): the reward on its last
        turn (``unassigned_reward`` when it has none), per-turn rewards, and ``merge_info`` in the
        last turn's info."""
        turns = episode.turns
        if self.turn_rewards is not None:
            for turn, reward in zip(turns, self.turn_rewards):
                turn.reward += reward
        if not turns:
            episode.unassigned_reward += self.reward
            return
        merged = self.merge_info(episode.info)
        last = turns[-1]
        last.reward += self.reward
        last.info.update(merged)


class RewardScorer:
    """The configured reward functions and judges.

    Args:
        config: the ``reward`` section.
        cache_dir: where judges keep their verdicts (the run folder); ``None``: in memory only.
        chat_model_for: ``chat_model_for("policy" | model path)`` -> a LangChain chat model, for
            judges with ``embedded`` (the trainer gives its engine's chat model for ``policy``).
    """

    def __init__(
        self,
        config: RewardConfig,
        *,
        cache_dir: Path | None = None,
        chat_model_for: Callable[[str], Any] | None = None,
    ):
        self.config = config
        self.functions = [RewardFunction(f, where=f"reward.functions[{i}]") for i, f in enumerate(config.functions)]
        self.judges: list[Any] = []
        if config.judges:
            from verlog.rewards.judge import build_judge

            self.judges = [
                build_judge(j, index=i, cache_dir=cache_dir, chat_model_for=chat_model_for)
                for i, j in enumerate(config.judges)
            ]
        self.pointwise = [j for j in self.judges if j.config.kind == "rubric"]
        self.ranking = [j for j in self.judges if j.config.kind == "ranking"]

    @property
    def empty(self) -> bool:
        return not self.functions and not self.judges

    def check_arguments(self, columns: Iterable[str] = ()) -> None:
        """Refuse, before any episode, reward functions whose arguments nothing provides and judges
        whose ``reference_column`` the rows lack (``ConfigError``)."""
        columns = list(columns)
        for function in self.functions:
            function.check_arguments(columns)
        for judge in self.judges:
            judge.check_columns(columns)

    def check_judges(self) -> None:
        """Before the first episode: every endpoint judge's server answers and serves its model
        (``ConfigError`` naming the judge's key otherwise)."""
        for judge in self.judges:
            judge.check_endpoint()

    def take_judge_failures(self) -> dict[str, float]:
        """The judges' verdicts failed since the last call, by judge and reason, as metrics
        (``judge_failures/<judge>/<reason>``; reasons: ``RewardError.reason``)."""
        return {
            f"judge_failures/{judge.name}/{reason}": float(n)
            for judge in self.judges
            for reason, n in sorted(judge.take_failures().items())
        }

    async def score(self, trajectory: Trajectory) -> Outcome:
        """Every reward function and rubric judge on one finished episode, concurrently."""
        parts = [(f.name, f.weight, f(trajectory)) for f in self.functions]
        parts += [(j.name, j.weight, j.score(trajectory)) for j in self.pointwise]
        outcome = Outcome()
        if not parts:
            return outcome
        results = await asyncio.gather(*(call for _, _, call in parts), return_exceptions=True)
        for (name, weight, _), result in zip(parts, results):
            if isinstance(result, BaseException):
                if isinstance(result, (RewardError, SlotFailureError)):  # a judge's stop stops the run, not the episode
                    raise result
                raise RewardError(f"{name}: {type(result).__name__}: {result}") from result
            outcome.add(name, weight, self.bounded(name, result))
        return outcome

    def bounded(self, name: str, result: RewardResult) -> RewardResult:
        """``result`` with its rewards clipped to ``reward.clip``; without a clip, a reward beyond
        ``reward.max_abs`` is a ``RewardError`` (the episode fails, with the reason)."""
        clip, limit = self.config.clip, self.config.max_abs
        values = [result.reward, *(result.turn_rewards or [])]
        if clip is not None:

            def bound(value: float) -> float:
                return max(-clip, min(clip, value))

            turn_rewards = None if result.turn_rewards is None else [bound(r) for r in result.turn_rewards]
            return dataclasses.replace(result, reward=bound(result.reward), turn_rewards=turn_rewards)
        if limit is not None and any(abs(v) > limit for v in values):
            worst = max(values, key=abs)
            raise RewardError(
                f"{name}: reward {worst:g} is beyond reward.max_abs ({limit:g}); scale the reward, set reward.clip "
                "to clip it, or raise reward.max_abs"
            )
        return result

    async def rank(self, group: Sequence[Trajectory]) -> list[Outcome]:
        """Every ranking judge on the episodes of one group (one task), in one call each."""
        outcomes = [Outcome() for _ in group]
        for judge in self.ranking:
            results = await judge.rank(list(group))
            if len(results) != len(group):
                raise RewardError(f"{judge.name}: {len(results)} verdicts for {len(group)} episodes")
            for outcome, result in zip(outcomes, results):
                outcome.add(judge.name, judge.weight, result)
        return outcomes
