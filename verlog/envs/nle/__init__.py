"""MiniHack and NetHack (the NetHack Learning Environment) played as text, declared as two
environment families, ``minihack`` and ``nethack``.

This module is the families' declaration, light on purpose (it imports no game package): the
MiniHack task list (:data:`MINIHACK_TASKS`, verlog name -> gym id), the tasks left out, the step
caps and :data:`MINIHACK_FAMILY`, :data:`NETHACK_FAMILY`. The games are :mod:`.env`; what the
model reads comes from one of two renderers: :mod:`.verlog_text` (verlog's own text,
``protocol="verlog"``) or :mod:`.balrog_text` (the text of BALROG's NLE language wrapper,
``protocol="balrog"``). :mod:`.agents` holds the scripted players.
"""

from __future__ import annotations

from typing import Any, Mapping

from verlog.envs.balrog_source import PromptCall
from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily
from verlog.envs.progression import minihack_progression, nethack_progression

#: BALROG's MiniHack tasks that run offline: verlog name -> gym id (BALROG's task name)
MINIHACK_TASKS: Mapping[str, str] = {
    "MazeWalk-9x9": "MiniHack-MazeWalk-9x9-v0",
    "MazeWalk-15x15": "MiniHack-MazeWalk-15x15-v0",
    "Corridor-R3": "MiniHack-Corridor-R3-v0",
    "CorridorBattle-Dark": "MiniHack-CorridorBattle-Dark-v0",
    "Quest-Easy": "MiniHack-Quest-Easy-v0",
    "Quest-Medium": "MiniHack-Quest-Medium-v0",
}
#: BALROG's MiniHack tasks that cannot run here, and why
MINIHACK_LEFT_OUT: Mapping[str, str] = {
    "Boxoban-Hard": "its levels are downloaded at run time, impossible offline",
    "Boxoban-Medium": "its levels are downloaded at run time, impossible offline",
}
#: the NetHack Challenge's gym id (BALROG's task name)
NETHACK_ID = "NetHackChallenge-v0"
#: BALROG's step caps
MINIHACK_MAX_STEPS = 100
NETHACK_MAX_STEPS = 100_000
#: BALROG's vision protocol: its NLE wrapper's ``vlm`` flag (the language view; the map as an image)
VISION_KWARGS: Mapping[str, Any] = {"vlm": True}


def _make_minihack(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.nle.env import make_minihack

    return make_minihack(task, seed, **kwargs)


def _minihack_bot(env: TextEnv) -> TextAgent | None:
    from verlog.envs.nle.agents import MiniHackSearchAgent
    from verlog.envs.nle.env import MiniHackTextEnv

    if not isinstance(env, MiniHackTextEnv):  # BALROG's variant answers one key at a time: no bot
        return None
    return MiniHackSearchAgent(can_open="open <direction>" in env.base_actions())


def _minihack_prompt(env: TextEnv, name: str) -> PromptCall:
    """BALROG passes the game (its ``actions``: the task's NLE actions) and the task name; its
    module imports the NLE language wrapper for the action names (verlog's copy of its table)."""
    from types import SimpleNamespace

    from verlog.envs.nle.balrog_text import NLE_ACTION_NAMES

    game = SimpleNamespace(actions=tuple(getattr(getattr(env, "game", None), "actions", ())))
    wrapper = SimpleNamespace(all_nle_action_map=NLE_ACTION_NAMES)
    return PromptCall("minihack", (game, name), names={"NLELanguageWrapper": wrapper})


def _make_nethack(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.nle.env import make_nethack

    return make_nethack(seed, **kwargs)


MINIHACK_FAMILY = EnvFamily(
    name="minihack",
    tasks=tuple(MINIHACK_TASKS),
    make=_make_minihack,
    bot=_minihack_bot,
    progression=minihack_progression,
    left_out=MINIHACK_LEFT_OUT,
    summary="MiniHack tasks (NetHack Learning Environment), as text",
    balrog=BalrogSettings(
        tasks=tuple((gym_id, task) for task, gym_id in MINIHACK_TASKS.items()),
        max_steps={task: MINIHACK_MAX_STEPS for task in MINIHACK_TASKS},
        episodes_per_task=5,
        invalid_action="north",
        env_kwargs={"protocol": "balrog"},
        left_out={f"MiniHack-{task}-v0": why for task, why in MINIHACK_LEFT_OUT.items()},
        prompt=_minihack_prompt,
        vision_kwargs=VISION_KWARGS,
    ),
)

NETHACK_FAMILY = EnvFamily(
    name="nethack",
    tasks=(),
    make=_make_nethack,
    progression=nethack_progression,
    summary="NetHack (the NetHack Challenge), as text",
    balrog=BalrogSettings(
        tasks=((NETHACK_ID, ""),),
        max_steps={"": NETHACK_MAX_STEPS},
        episodes_per_task=5,
        invalid_action="esc",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("nle"),
        vision_kwargs=VISION_KWARGS,
    ),
)

__all__ = [
    "MINIHACK_FAMILY",
    "MINIHACK_LEFT_OUT",
    "MINIHACK_MAX_STEPS",
    "MINIHACK_TASKS",
    "NETHACK_FAMILY",
    "NETHACK_ID",
    "NETHACK_MAX_STEPS",
]
