"""The text-environment interface every verlog game speaks.

An environment is a game played in text: ``reset`` returns the first observation and the
instruction, ``step`` takes one text action. Graphs read only these strings, so what a model
sees during training, evaluation and production is exactly what ``verlog play`` shows a person.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol

from verlog.step_info import StepInfo


@dataclass
class StepResult:
    """The outcome of one action.

    ``terminated``: the task ended (win or loss): no bootstrapping past it.
    ``truncated``: a step cap cut the episode: the last state still has a value.
    ``info`` is a :class:`verlog.step_info.StepInfo` (built with :func:`verlog.step_info.step_info`):
    at least ``action`` (the action actually executed), ``valid_action`` (whether the text parsed to
    a valid action), ``step``, and ``success`` once the episode ends.
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: StepInfo = field(default_factory=lambda: StepInfo())

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class EpisodeSeeds:
    """The seed of each episode of a game drawing its levels from a seed: ``next(seed)`` is
    ``seed`` when a reset names one; without one, the first episode plays the game's own seed
    (when it was given one) and later ones draw from a stream derived from it."""

    def __init__(self, seed: int | None = None) -> None:
        self._first = seed
        self._stream = random.Random(seed)
        self._resets = 0

    def next(self, seed: int | None = None) -> int:
        if seed is None:
            seed = self._first if self._resets == 0 and self._first is not None else self._stream.getrandbits(63)
        self._resets += 1
        return seed


class TextEnv(abc.ABC):
    """A seeded text game.

    Subclasses set ``name`` and implement ``reset``, ``step`` and ``instruction``; a game with a
    fixed action set lists it in ``actions`` (with ``action_help``), one whose actions change
    with the state overrides ``valid_actions``. ``step`` accepts the model's raw answer text: parsing (``ACTION: ...``),
    tolerant matching and the invalid-action penalty are the environment's job, so every graph
    gets the same rules.
    """

    name: str = "text-env"
    max_steps: int = 100
    #: the fixed action names of the game, in a stable order (empty: see ``valid_actions``)
    actions: ClassVar[tuple[str, ...]] = ()
    #: one line of help per action name, shown in the instruction
    action_help: ClassVar[Mapping[str, str]] = {}

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> str:
        """Start a new episode and return the first observation text."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply one action given as text (a model's full answer or a bare action name)."""

    def valid_actions(self) -> list[str]:
        """The action names accepted now, in a stable order."""
        return list(self.actions)

    def actions_text(self) -> str:
        """The ``- name: help`` lines of the fixed actions, for the instruction."""
        return "\n".join(f"- {name}: {self.action_help[name]}" for name in self.actions)

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """The system text: the game's rules, the goal of this episode, the answer format."""

    def observation_image(self) -> Any:
        """The current observation as a PIL RGB image, drawn as BALROG's vision protocol draws
        it (:mod:`verlog.envs.balrog_vision`), or ``None`` for a game shown as text only (the
        default; TextWorld). Drawing it changes nothing in the game."""
        return None

    def close(self) -> None:  # noqa: B027 (a hook: most games hold nothing to release)
        """Release resources."""


class TextAgent(Protocol):
    """Anything that answers observations with text (oracles, scripted and random players):
    ``reset`` after each ``env.reset``."""

    def reset(self) -> None: ...

    def act(self, observation: str) -> str: ...


def play_steps(env: TextEnv, agent: TextAgent, seed: int | None = None) -> list[StepResult]:
    """Play one episode of ``env`` (reset with ``seed``) with ``agent``; every step's result, in order."""
    observation = env.reset(seed)
    agent.reset()
    results: list[StepResult] = []
    while True:
        result = env.step(agent.act(observation))
        results.append(result)
        observation = result.observation
        if result.done:
            return results


class AnswerFnAgent:
    """An oracle that reads the game's state: asks ``answer_fn(env)`` for each answer."""

    def __init__(self, env: TextEnv, answer_fn: Callable[[TextEnv], str]) -> None:
        self.env = env
        self.answer_fn = answer_fn

    def reset(self) -> None:
        pass

    def act(self, observation: str) -> str:
        return self.answer_fn(self.env)
