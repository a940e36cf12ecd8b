"""BabyAI (minigrid's grid-world missions) played as text, declared as an environment family.

This module is the family's declaration, light on purpose (it imports no game package):
:data:`TASKS`, :data:`FAMILY` (how to build a game, its bot, its progression, BALROG's protocol).
The game itself is :mod:`.env`.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.balrog_source import PromptCall
from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily
from verlog.envs.progression import won_progression

#: BabyAI's mission kinds, as verlog names them
KINDS: tuple[str, ...] = ("goto", "pickup", "pick_up_seq_go_to", "open", "putnext")
#: the kinds in BALROG's order (its BabyAI tasks)
BALROG_KINDS: tuple[str, ...] = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
#: the games: one kind each, and ``mixed``: BALROG's five kinds in turn, kind ``seed % 5``
TASKS: tuple[str, ...] = (*KINDS, "mixed")


def _make(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.babyai.env import BabyAITextEnv

    return BabyAITextEnv(task, seed, **kwargs)


def _bot(env: TextEnv) -> TextAgent:
    from verlog.envs.babyai.env import BabyAIBotAgent, BabyAITextEnv

    assert isinstance(env, BabyAITextEnv)
    return BabyAIBotAgent(env)


FAMILY = EnvFamily(
    name="babyai",
    tasks=TASKS,
    make=_make,
    bot=_bot,
    progression=won_progression,
    summary="BabyAI grid-world missions (minigrid), as text",
    # BALROG: BabyAI-MixedTrainLocal-v0 restricted to one mission kind, num_dists 0; caps are the
    # level's own (minigrid's room_size**2 per instruction step, see verlog/envs/babyai/env.py)
    balrog=BalrogSettings(
        tasks=tuple((f"BabyAI-MixedTrainLocal-v0/{task}", task) for task in BALROG_KINDS),
        episodes_per_task=10,
        invalid_action="go forward",
        env_kwargs={"protocol": "balrog"},
        # BALROG's evaluator passes the level's mission
        prompt=lambda env, name: PromptCall("babyai_text", (None,), {"mission": getattr(env, "mission", "")}),
    ),
)

__all__ = ["BALROG_KINDS", "FAMILY", "KINDS", "TASKS"]
