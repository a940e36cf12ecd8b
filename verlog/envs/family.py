"""What an environment family is: the declaration type every game fills in (:class:`EnvFamily`).

A *family* is one game with its tasks (``babyai`` with ``goto``, ``pickup`` ...; ``crafter`` with
no task). Its :class:`EnvFamily` says everything the rest of verlog needs to know about it:

* ``name`` and ``tasks``: the environment names are ``"<name>:<task>"`` (or just ``"<name>"`` for
  a family without tasks);
* ``make(task, seed, **kwargs) -> TextEnv``: builds one game (``task`` is ``""`` for a family
  without tasks); it should import the game's heavy packages *inside* the function, so listing
  names stays cheap;
* ``bot(env) -> TextAgent | None``: the oracle or scripted player (``verlog play --agent bot``,
  the oracle tests and benchmarks), or ``None`` when the game has none;
* ``progression(episode_info) -> float``: BALROG's 0-1 progression of an episode from its last
  step's ``info`` (see :mod:`verlog.envs.progression`);
* ``balrog``: the :class:`BalrogSettings` of BALROG's evaluation protocol for this game (its task
  list, step caps, history length, answer budget, the action run on an invalid answer, and the
  constructor settings that switch the game to BALROG's levels and wording, and to its vision
  protocol's text), or ``None``. A game that BALROG shows as an image too draws it in its
  ``TextEnv.observation_image``.

This module holds the types and the protocol names only. verlog's own families are declared in
their game folders (``verlog/envs/<game>/__init__.py``: ``babyai``, ``babaisai``, ``crafter``,
``textworld``, ``nle`` for ``minihack`` and ``nethack``); :mod:`verlog.envs.registry` holds them
all by name and is what the rest of verlog asks (``make_env``, ``get_family``). Another package
adds a game with :func:`verlog.envs.register_family` or an entry point (see :mod:`verlog.registry`)::

    from verlog.envs import EnvFamily, register_family
    register_family(EnvFamily(name="mygame", tasks=("easy", "hard"), make=make_mygame,
                              progression=goal_progression))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from verlog.envs.base import TextAgent, TextEnv

#: the evaluation protocols a game graph can play under: verlog's training variant or BALROG's
PROTOCOLS: tuple[str, ...] = ("verlog", "balrog")

MakeFn = Callable[..., TextEnv]
BotFn = Callable[[TextEnv], "TextAgent | None"]
ProgressionFn = Callable[[Mapping[str, Any]], float]


@dataclass(frozen=True)
class BalrogSettings:
    """BALROG's evaluation protocol for one family (from balrog-ai/BALROG's ``config.yaml`` and
    the environment wrappers it installs).

    Attributes:
        tasks: BALROG's task list, in its order, as ``(BALROG's name, verlog task)`` pairs (the
            verlog task is ``""`` for a family without tasks).
        max_steps: the step cap of each verlog task under BALROG's protocol (a task missing here
            keeps its game's own default under ``env_kwargs``).
        episodes_per_task: BALROG's ``eval.num_episodes`` for the family.
        history_length: past observations kept in the prompt (BALROG's ``max_text_history``).
        max_tokens: the answer budget of each model call (BALROG's ``generate_kwargs.max_tokens``).
        invalid_action: the action BALROG runs when an answer names no valid action.
        env_kwargs: constructor settings that switch the game to BALROG's levels and wording.
        left_out: BALROG tasks verlog cannot run, each with the reason.
        prompt: how BALROG's evaluator asks a game for its instruction, ``(env, BALROG's task
            name) -> verlog.envs.balrog_source.PromptCall`` (read from the user's BALROG); ``None``:
            the game's own instruction is always used.
        source_kwargs: constructor settings taken from the user's BALROG, ``(BalrogSource,
            BALROG's task name) -> kwargs`` (TextWorld: its game files).
        vision_kwargs: constructor settings of BALROG's vision protocol (``max_image_history``
            above 0: :mod:`verlog.envs.balrog_vision`), e.g. NetHack's language-only text.
    """

    tasks: tuple[tuple[str, str], ...]
    max_steps: Mapping[str, int] = field(default_factory=dict)
    episodes_per_task: int = 10
    history_length: int = 16
    max_tokens: int = 8192
    invalid_action: str | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    left_out: Mapping[str, str] = field(default_factory=dict)
    prompt: Callable[[TextEnv, str], Any] | None = None
    source_kwargs: Callable[[Any, str], Mapping[str, Any]] | None = None
    vision_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def task_names(self) -> tuple[str, ...]:
        """BALROG's task names, in its order."""
        return tuple(name for name, _ in self.tasks)

    def verlog_tasks(self) -> tuple[str, ...]:
        """The verlog tasks BALROG plays, in BALROG's order."""
        return tuple(task for _, task in self.tasks)

    def balrog_name(self, task: str) -> str:
        """BALROG's name of the verlog task ``task``."""
        for name, verlog_task in self.tasks:
            if verlog_task == task:
                return name
        raise ValueError(f"BALROG has no task {task!r}; its tasks: {', '.join(self.verlog_tasks())}")


@dataclass(frozen=True)
class EnvFamily:
    """One game and its tasks (see the module docstring for what each field is for)."""

    name: str
    tasks: tuple[str, ...]
    make: MakeFn
    progression: ProgressionFn
    bot: BotFn | None = None
    balrog: BalrogSettings | None = None
    #: tasks that exist in the original benchmark but not here, each with the reason
    left_out: Mapping[str, str] = field(default_factory=dict)
    #: one line saying what the game is (``verlog play`` and docs)
    summary: str = ""

    def env_names(self) -> list[str]:
        """The registry names of the family's games."""
        return [f"{self.name}:{task}" for task in self.tasks] if self.tasks else [self.name]

    def has_task(self, task: str) -> bool:
        """Whether ``task`` names one of the family's games (``""`` for a family without tasks)."""
        return task in self.tasks if self.tasks else not task

    def make_env(self, task: str, seed: int | None = None, protocol: str = "verlog", **kwargs: Any) -> TextEnv:
        """Build the game of ``task``; ``protocol="balrog"`` applies :attr:`balrog`'s settings
        (levels, wording, invalid action, step cap), which explicit ``kwargs`` still override."""
        check_protocol(protocol)
        if not self.has_task(task):
            if not self.tasks:
                raise ValueError(f"{self.name!r} has no tasks (got {task!r}): use the name {self.name!r} alone")
            note = f" ({self.left_out[task]})" if task in self.left_out else ""
            raise ValueError(f"unknown {self.name} task {task!r}{note}; valid tasks: {', '.join(self.tasks)}")
        if protocol == "balrog":
            kwargs = {**self.balrog_kwargs(task), **kwargs}
        return self.make(task, seed, **kwargs)

    def balrog_kwargs(self, task: str) -> dict[str, Any]:
        """The constructor settings of ``task`` under BALROG's protocol."""
        if self.balrog is None:
            raise ValueError(f"{self.name!r} has no BALROG protocol")
        kwargs = dict(self.balrog.env_kwargs)
        if task in self.balrog.max_steps:
            kwargs["max_steps"] = self.balrog.max_steps[task]
        return kwargs


def check_protocol(protocol: str) -> str:
    """``protocol`` itself, or a ``ValueError`` naming the valid ones."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    return protocol


def family_name_of(env_name: str) -> str:
    """``"minihack:MazeWalk-9x9"`` -> ``"minihack"`` (``"nethack"`` -> ``"nethack"``)."""
    return env_name.partition(":")[0]
