"""TextWorld's generated text adventures, declared as an environment family.

This module is the family's declaration, light on purpose (it imports no game package):
:data:`GAMES`, :data:`BALROG_TASK_NAMES`, :data:`FAMILY`. The game is :mod:`.env`; :mod:`.games`
builds game files offline and caches them; :mod:`.generator` is verlog's faster, equivalent
constraint check for TextWorld's generator.
"""

from __future__ import annotations

from typing import Any, Mapping

from verlog.envs.balrog_source import BalrogSource, PromptCall
from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily
from verlog.envs.progression import textworld_progression

#: the TextWorld challenges verlog plays, as verlog names them (the family's tasks)
GAMES: tuple[str, ...] = ("treasure_hunter", "coin_collector", "cooking")
#: BALROG's name of each game (its task list), in BALROG's order
BALROG_TASK_NAMES: Mapping[str, str] = {
    "treasure_hunter": "treasure_hunter",
    "cooking": "the_cooking_game",
    "coin_collector": "coin_collector",
}
#: BALROG's step cap (``textworld_kwargs.max_episode_steps``)
BALROG_MAX_STEPS = 80


def _make(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.textworld.env import TextWorldTextEnv

    return TextWorldTextEnv(task, seed, **kwargs)


def _balrog_games(source: BalrogSource, name: str) -> dict[str, Any]:
    """BALROG's own game files of the task (from the user's BALROG), played instead of verlog's pool."""
    return {"game_files": tuple(str(path) for path in source.textworld_games(name))}


def _bot(env: TextEnv) -> TextAgent:
    from verlog.envs.textworld.env import TextWorldTextEnv, TextWorldWalkthroughAgent

    assert isinstance(env, TextWorldTextEnv)
    return TextWorldWalkthroughAgent(env)


FAMILY = EnvFamily(
    name="textworld",
    tasks=GAMES,
    make=_make,
    bot=_bot,
    progression=textworld_progression,
    summary="TextWorld's generated text adventures",
    balrog=BalrogSettings(
        tasks=tuple((name, game) for game, name in BALROG_TASK_NAMES.items()),
        max_steps={game: BALROG_MAX_STEPS for game in GAMES},
        episodes_per_task=10,
        invalid_action=None,  # every answer is a command: the game itself answers a bad one
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("textworld", (None, name)),
        source_kwargs=_balrog_games,
    ),
)

__all__ = ["BALROG_MAX_STEPS", "BALROG_TASK_NAMES", "FAMILY", "GAMES"]
