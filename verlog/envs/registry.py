"""Every text game verlog knows, by name: ``make_env("babyai:goto", seed=0)`` and ``list_envs()``.

The names come from the environment families (:mod:`verlog.envs.family`; verlog's own are declared
in :mod:`verlog.envs.families`): ``"<family>:<task>"``, or the family's name alone for a game
without tasks (``crafter``, ``nethack``). Game modules are imported only when a game is made, so
listing names stays cheap.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.base import TextEnv
from verlog.envs.family import families, split_env_name
from verlog.envs.families import BABYAI_TASKS, MINIHACK_LEFT_OUT, MINIHACK_TASKS, TEXTWORLD_GAMES

__all__ = ["BABYAI_TASKS", "MINIHACK_LEFT_OUT", "MINIHACK_TASKS", "TEXTWORLD_GAMES", "list_envs", "make_env"]


def list_envs() -> list[str]:
    """All valid environment names, family by family in a stable order."""
    return [name for family in families().values() for name in family.env_names()]


def make_env(name: str, seed: int | None = None, protocol: str = "verlog", **kwargs: Any) -> TextEnv:
    """Build the text environment called ``name`` (see ``list_envs``).

    ``seed`` seeds the first ``reset()``; ``protocol="balrog"`` builds the game with BALROG's
    settings (levels, wording, invalid-answer action, step cap: see ``EnvFamily.balrog``);
    ``kwargs`` go to the game's constructor (``None`` values are dropped, so callers can pass
    optional settings through unconditionally). Common ones: ``invalid_action_penalty`` and
    ``max_steps``.
    """
    family, task = split_env_name(name)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return family.make_env(task, seed, protocol=protocol, **kwargs)
