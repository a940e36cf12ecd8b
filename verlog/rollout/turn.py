"""The records a rollout produces: a ``Turn`` per model call, an ``Episode`` per graph run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: how an episode ended: ``ok``, or how it failed: ``error`` (the graph raised), ``recursion_limit``,
#: ``timeout``, ``interrupted`` (it stopped at LangGraph's ``interrupt()`` and nobody answered:
#: no ``multi_turn.langgraph.on_interrupt``, or still paused after ``max_resumes`` answers)
EpisodeStatus = Literal["ok", "error", "recursion_limit", "timeout", "interrupted"]


@dataclass
class Turn:
    """One model call, exactly as the engine saw and produced it: one training sample.

    ``turn_index`` is the call's place among its episode's training calls in start order (unique in
    the episode; a call discarded or failed leaves its number unused). ``prompt_ids`` are the ids
    the engine received, ``response_ids`` the ids it returned (never
    re-encoded from text), ``logprobs`` one per response id, drawn with ``temperature``,
    ``top_p`` and ``top_k`` (each node may sample its own way: every recomputation of a logprob,
    ratio, KL or entropy uses the turn's own temperature). ``reward`` is the sum of the rewards
    the environment reported after this call and before the next one; ``terminated`` means the
    task ended here (no bootstrap), ``truncated`` that a limit cut it: the state after the cut
    still has a value, read from ``next_prompt_ids`` (the prompt the model would have been given
    next) when the rollout could render it.
    """

    episode_id: str
    turn_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""
    #: the sampling the response was drawn with (a greedy call, temperature 0, is scored at 1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    #: the kind of constraint (grammar) the response was sampled under, ``None`` if unconstrained:
    #: its logprobs are those of the masked distribution, not of the policy
    constraint: str | None = None
    #: that constraint's grammar (``Constraint.grammar``), from which training rebuilds the masks
    #: the response was sampled under (``None``: unconstrained, or not known, e.g. a stored trace)
    grammar: str | None = None
    #: the images of the prompt (a vision-language model's turn), in prompt order: each encoded
    #: file in base64; the model's processor turns them into the pixels the engine saw
    images: tuple[str, ...] = ()
    #: truncated turns: the prompt ids of the state after the cut (``None``: not known)
    next_prompt_ids: list[int] | None = None
    #: the LangGraph node that made the call (``langgraph_node`` metadata), if any
    node: str | None = None
    #: environment info reported with the rewards (e.g. ``success``, ``valid_action``)
    info: dict[str, Any] = field(default_factory=dict)
    #: the messages the model received (kept only when the recorder is asked to)
    messages: list[Any] | None = None
    #: the version of the weights that sampled it, counted in updates (a training slot's turn: the
    #: updates the trainer had published when its call was admitted; ``None``: not known)
    policy_version: int | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"turn {self.turn_index} of {self.episode_id}: {len(self.response_ids)} response ids "
                f"but {len(self.logprobs)} logprobs"
            )

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def scoring_temperature(self) -> float:
        """The temperature to recompute this turn's logprobs at (greedy calls were scored at 1)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Episode:
    """One run of a graph: its turns and how it ended.

    A failed episode (``status`` other than ``"ok"``: the graph raised, hit its recursion limit,
    timed out or stopped at an unanswered ``interrupt()``) keeps its turns for inspection but
    offers none for training.
    """

    episode_id: str
    turns: list[Turn]
    status: EpisodeStatus = "ok"
    error: str | None = None
    #: the graph's final state (``None`` when it failed)
    output: Any = None
    #: rewards reported before the first model call (they belong to no turn)
    unassigned_reward: float = 0.0
    #: calls of chat models that carry no verlog token data (not trainable, counted)
    uncaptured_calls: int = 0
    #: chat-model calls the graph made, trained or not (0: the graph never called a model)
    model_calls: int = 0
    #: calls made in attempts that then raised (a retried node...): not trained by default
    discarded_calls: int = 0
    #: answers given to the graph's ``interrupt()`` pauses (``multi_turn.langgraph.on_interrupt``)
    resumes: int = 0
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    @property
    def total_reward(self) -> float:
        return self.unassigned_reward + sum(t.reward for t in self.turns)

    @property
    def info(self) -> dict[str, Any]:
        """The environment info of the last turn that reported one (e.g. ``success``)."""
        for turn in reversed(self.turns):
            if turn.info:
                return turn.info
        return {}

    def trainable_turns(self) -> list[Turn]:
        """The turns to train on: all of them for a finished episode, none for a failed one."""
        return [] if self.failed else list(self.turns)
