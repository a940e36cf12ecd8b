"""Crafter, the 2D survival game, played as text, declared as an environment family.

This module is the family's declaration, light on purpose (it imports no game package):
:data:`FAMILY`. The game is :mod:`.env` (verlog's text and the scripted players);
:mod:`.balrog_text` renders the text BALROG's evaluation shows.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.balrog_source import PromptCall
from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily
from verlog.envs.progression import crafter_progression

#: BALROG's episode length for Crafter (``crafter_kwargs.max_episode_steps``)
BALROG_MAX_STEPS = 2000
#: BALROG's Crafter image size in pixels (``crafter_kwargs.size``): how many random numbers each
#: rendering of a night frame draws depends on it (see :mod:`.env`)
BALROG_IMAGE_SIZE = (256, 256)


def _make(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.crafter.env import CrafterTextEnv

    return CrafterTextEnv(seed, **kwargs)


def _bot(env: TextEnv) -> TextAgent:
    from verlog.envs.crafter.env import BalrogCrafterScriptedAgent, CrafterScriptedAgent, CrafterTextEnv

    if isinstance(env, CrafterTextEnv) and env.balrog:
        return BalrogCrafterScriptedAgent(env)
    return CrafterScriptedAgent()


FAMILY = EnvFamily(
    name="crafter",
    tasks=(),
    make=_make,
    bot=_bot,
    progression=crafter_progression,
    summary="Crafter, the 2D survival game, as text",
    balrog=BalrogSettings(
        tasks=(("default", ""),),
        max_steps={"": BALROG_MAX_STEPS},
        episodes_per_task=10,
        invalid_action="Noop",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("crafter", (name,)),
    ),
)

__all__ = ["BALROG_IMAGE_SIZE", "BALROG_MAX_STEPS", "FAMILY"]
