"""What a reward function or judge receives (``Trajectory``) and gives back (``RewardResult``)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["RESULT_KEYS", "VERL_SCORE_KEY", "RewardResult", "Trajectory", "as_result"]


@dataclass
class RewardResult:
    """A reward function's verdict on one episode.

    ``reward`` is added to the episode's last turn (where the environment's own final reward
    sits); ``turn_rewards``, when given, has one reward per recorded turn (``Trajectory.turns``,
    in order), each added to its turn; ``success`` says whether the task was solved (``None``: the
    function does not say); ``info`` is kept with the episode (logged, shown by ``verlog eval``).
    """

    reward: float = 0.0
    success: bool | None = None
    turn_rewards: list[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Trajectory:
    """One finished episode, as reward functions and judges see it.

    ``state`` is the graph's final state (its output), ``row`` the dataset row the episode played
    (``None`` for a seed-made episode), ``key`` its row index or seed, ``turns`` the recorded model
    calls (empty when the model was an endpoint without token data), ``info`` what the graph
    reported with its own rewards (``areport_reward(..., info=...)``).
    """

    state: Any
    row: Mapping[str, Any] | None = None
    key: int | None = None
    turns: Sequence[Any] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    episode_id: str = ""

    @property
    def messages(self) -> list[Any]:
        """The final state's ``messages`` (LangChain messages), or ``[]`` when it has none."""
        state = self.state
        messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
        return list(messages or [])

    @property
    def completion(self) -> str:
        """The text of the last AI message: the agent's final answer (``""`` when there is none)."""
        for message in reversed(self.messages):
            if getattr(message, "type", None) == "ai":
                content = message.content
                if isinstance(content, str):
                    return content
                return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        return ""

    @property
    def prompt(self) -> str:
        """The text of the first human message: the task as the agent was given it."""
        for message in self.messages:
            if getattr(message, "type", None) == "human":
                content = message.content
                return content if isinstance(content, str) else str(content)
        return ""


#: the key of a verl reward function's dict return holding the reward (its other keys are logged)
VERL_SCORE_KEY = "score"
#: the keys of verlog's own dict return
RESULT_KEYS = ("reward", "success", "turn_rewards", "info")


def _scalar(value: Any) -> Any:
    """A numpy or torch scalar (``np.float32``, ``np.bool_``, a one-element array or tensor...) as
    the Python number or bool it holds; anything else unchanged."""
    module = type(value).__module__.split(".", 1)[0]
    if module in ("numpy", "torch") and callable(getattr(value, "item", None)):
        size = value.numel() if module == "torch" else getattr(value, "size", 1)
        if size == 1:
            return value.item()
    return value


def _number(value: Any, what: str) -> float:
    value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number}")
    return number


def as_result(value: Any, turns: int) -> RewardResult:
    """A reward function's return value as a checked ``RewardResult``: a real number (Python,
    numpy or torch scalar: the reward), a bool of any of them (reward 1/0 and success), a
    ``RewardResult``, a dict of its fields, or verl's dict (``score`` the reward, its other keys
    kept in ``info``). ``turns``: how many turns ``turn_rewards`` must cover. Non-finite numbers
    are refused (``ValueError``)."""
    value = _scalar(value)
    if isinstance(value, bool):
        return RewardResult(float(value), success=value)
    if isinstance(value, numbers.Real):
        return RewardResult(_number(value, "the reward"))
    if isinstance(value, Mapping):
        if "reward" not in value and VERL_SCORE_KEY in value:  # verl's shape
            info = {str(k): _scalar(v) for k, v in value.items() if k != VERL_SCORE_KEY}
            return RewardResult(_number(value[VERL_SCORE_KEY], "the dict's 'score'"), info=info)
        unknown = sorted(map(str, set(value) - set(RESULT_KEYS)))
        if unknown:
            raise ValueError(
                f"returned a dict with unknown keys {unknown}; return verlog's dict (keys: {', '.join(RESULT_KEYS)}) "
                f"or verl's (its '{VERL_SCORE_KEY}' is the reward, its other keys are logged)"
            )
        value = RewardResult(
            reward=value.get("reward", 0.0),
            success=value.get("success"),
            turn_rewards=value.get("turn_rewards"),
            info=dict(value.get("info") or {}),
        )
    if not isinstance(value, RewardResult):
        raise TypeError(
            f"returned {type(value).__name__}; return a real number, a bool, a dict with 'reward' (and optionally "
            f"'success', 'turn_rewards', 'info'), verl's dict with '{VERL_SCORE_KEY}', or a verlog.rewards.RewardResult"
        )
    reward = _number(value.reward, "reward")
    success = _scalar(value.success)
    if success is not None and not isinstance(success, bool):
        raise TypeError(f"success must be a bool or None, got {success!r}")
    turn_rewards = None
    if value.turn_rewards is not None:
        turn_rewards = [_number(r, "each turn reward") for r in value.turn_rewards]
        if len(turn_rewards) != turns:
            raise ValueError(f"turn_rewards has {len(turn_rewards)} values for {turns} recorded turns")
    return RewardResult(reward, success, turn_rewards, dict(value.info or {}))
