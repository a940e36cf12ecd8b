"""Every text game verlog knows, by name.

``make_env("babyai:goto", seed=0)`` builds a ``TextEnv``; ``list_envs()`` names them all:

- ``babyai:goto``, ``babyai:pickup``, ``babyai:pick_up_seq_go_to``, ``babyai:open``
  (``verlog.envs.babyai``; extra kwargs: ``layout``, ``default_action``)
- ``crafter`` (``verlog.envs.crafter_env``; extra kwarg: ``max_per_type``)
- ``babaisai:<task>`` for each task of ``verlog.envs.babaisai.TASKS``, when that package is present
- ``textworld:treasure_hunter``, ``textworld:coin_collector``, ``textworld:cooking``
  (``verlog.envs.textworld_env``; extra kwargs: the generator settings such as ``level``,
  ``recipe``, ``go``, and ``cache_dir``)
- ``minihack:<task>`` for each task of ``MINIHACK_TASKS`` (``verlog.envs.nle_env``; extra kwargs:
  ``show_map``, ``character``, ``autopickup``) and ``nethack`` (``show_map``, ``character``,
  ``no_progress_timeout``)

Common kwargs: ``invalid_action_penalty`` (default 0.1) and ``max_steps`` (per-game default).
Game modules are imported only when used, so listing names stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from verlog.envs.base import TextEnv

BABYAI_TASKS: tuple[str, ...] = ("goto", "pickup", "pick_up_seq_go_to", "open")
TEXTWORLD_GAMES: tuple[str, ...] = ("treasure_hunter", "coin_collector", "cooking")
#: BALROG's MiniHack tasks that run offline (Boxoban-Hard/Medium download their levels: left out)
MINIHACK_TASKS: tuple[str, ...] = (
    "MazeWalk-9x9",
    "MazeWalk-15x15",
    "Corridor-R3",
    "CorridorBattle-Dark",
    "Quest-Easy",
    "Quest-Medium",
)
MINIHACK_LEFT_OUT: tuple[str, ...] = ("Boxoban-Hard", "Boxoban-Medium")
_BABAISAI = "verlog.envs.babaisai"


def _babaisai_module(required: bool) -> ModuleType | None:
    """The BabaIsAI package, or ``None`` when it is absent and not ``required``."""
    try:
        return importlib.import_module(_BABAISAI)
    except ModuleNotFoundError as exc:
        if required or exc.name not in (_BABAISAI, "verlog.envs"):
            raise
        return None


def list_envs() -> list[str]:
    """All valid environment names, in a stable order."""
    names = [f"babyai:{task}" for task in BABYAI_TASKS] + ["crafter"]
    module = _babaisai_module(required=False)
    if module is not None:
        names += [f"babaisai:{task}" for task in module.TASKS]
    names += [f"textworld:{game}" for game in TEXTWORLD_GAMES]
    names += [f"minihack:{task}" for task in MINIHACK_TASKS] + ["nethack"]
    return names


def _unknown(name: str) -> ValueError:
    valid = ", ".join(list_envs())
    note = ""
    if name.partition(":")[2] in MINIHACK_LEFT_OUT:
        note = f" ({name.partition(':')[2]} is left out: its levels are downloaded at run time, impossible offline)"
    return ValueError(f"unknown environment {name!r}{note}; valid names: {valid}")


def make_env(name: str, seed: int | None = None, **kwargs: Any) -> TextEnv:
    """Build the text environment called ``name`` (see ``list_envs``).

    ``seed`` seeds the first ``reset()``; ``kwargs`` go to the game's constructor (``None``
    values are dropped, so callers can pass optional settings through unconditionally).
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    family, _, task = name.partition(":")
    if family == "babyai" and task in BABYAI_TASKS:
        from verlog.envs.babyai import BabyAITextEnv

        return BabyAITextEnv(task, seed, **kwargs)
    if name == "crafter":
        from verlog.envs.crafter_env import CrafterTextEnv

        return CrafterTextEnv(seed, **kwargs)
    if family == "babaisai" and task:
        module = _babaisai_module(required=False)
        if module is None:
            raise ValueError(
                f"unknown environment {name!r}: the BabaIsAI games ({_BABAISAI}) are not "
                f"installed; valid names: {', '.join(list_envs())}"
            )
        if task not in module.TASKS:
            raise _unknown(name)
        return module.make(task, seed, **kwargs)
    if family == "textworld" and task in TEXTWORLD_GAMES:
        from verlog.envs.textworld_env import TextWorldTextEnv

        return TextWorldTextEnv(task, seed, **kwargs)
    if family == "minihack" and task in MINIHACK_TASKS:
        from verlog.envs.nle_env import MiniHackTextEnv

        return MiniHackTextEnv(task, seed, **kwargs)
    if name == "nethack":
        from verlog.envs.nle_env import NetHackTextEnv

        return NetHackTextEnv(seed, **kwargs)
    raise _unknown(name)
