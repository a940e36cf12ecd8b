"""verlog's own environment families, declared (see :mod:`verlog.envs.family`).

This module is light on purpose: it imports no game package. Each ``make``/``bot`` function imports
its game module when called, so ``list_envs()`` costs nothing. Each game keeps its section here:
its task list, its players, and BALROG's protocol for it (from balrog-ai/BALROG's
``balrog/config/config.yaml``: episodes per task, ``max_text_history: 16``, ``max_tokens: 8192``;
the step caps and invalid-answer actions from the environment wrappers BALROG installs).
"""

from __future__ import annotations

from typing import Any

from verlog.envs.balrog_source import BalrogSource, PromptCall
from verlog.envs.base import AnswerFnAgent, TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily, register_family
from verlog.envs.progression import (
    babaisai_progression,
    babyai_progression,
    crafter_progression,
    minihack_progression,
    nethack_progression,
    textworld_progression,
)

# --------------------------------------------------------------------------------------------
# BabyAI (verlog/envs/babyai/env.py)

BABYAI_TASKS: tuple[str, ...] = ("goto", "pickup", "pick_up_seq_go_to", "open", "putnext")


def _make_babyai(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.babyai.env import BabyAITextEnv

    return BabyAITextEnv(task, seed, **kwargs)


def _babyai_bot(env: TextEnv) -> TextAgent:
    from verlog.envs.babyai.env import BabyAIBotAgent, BabyAITextEnv

    assert isinstance(env, BabyAITextEnv)
    return BabyAIBotAgent(env)


register_family(EnvFamily(
    name="babyai",
    tasks=BABYAI_TASKS,
    make=_make_babyai,
    bot=_babyai_bot,
    progression=babyai_progression,
    summary="BabyAI grid-world missions (minigrid), as text",
    # BALROG: BabyAI-MixedTrainLocal-v0 restricted to one mission kind, num_dists 0; caps are the
    # level's own (minigrid's room_size**2 per instruction step, see verlog/envs/babyai/env.py)
    balrog=BalrogSettings(
        tasks=(
            ("BabyAI-MixedTrainLocal-v0/goto", "goto"),
            ("BabyAI-MixedTrainLocal-v0/pickup", "pickup"),
            ("BabyAI-MixedTrainLocal-v0/open", "open"),
            ("BabyAI-MixedTrainLocal-v0/putnext", "putnext"),
            ("BabyAI-MixedTrainLocal-v0/pick_up_seq_go_to", "pick_up_seq_go_to"),
        ),
        episodes_per_task=10,
        invalid_action="go forward",
        env_kwargs={"protocol": "balrog"},
        # BALROG's evaluator passes the level's mission
        prompt=lambda env, name: PromptCall("babyai_text", (None,), {"mission": getattr(env, "mission", "")}),
    ),
))

# --------------------------------------------------------------------------------------------
# BabaIsAI (verlog/envs/babaisai)

#: BALROG's 40 BabaIsAI tasks, in its order (its names carry an ``env/`` prefix)
BABAISAI_BALROG_TASKS: tuple[str, ...] = (
    "make_win-distr_obj_rule",
    "goto_win-distr_obj_rule",
    "goto_win",
    "goto_win-distr_obj",
    "goto_win-distr_rule",
    "goto_win-distr_obj-irrelevant_rule",
    "make_win-distr_obj",
    "make_win-distr_rule",
    "make_win",
    "make_win-distr_obj-irrelevant_rule",
    "two_room-goto_win",
    "two_room-goto_win-distr_obj_rule",
    "two_room-goto_win-distr_rule",
    "two_room-goto_win-distr_obj",
    "two_room-goto_win-distr_obj-irrelevant_rule",
    "two_room-goto_win-distr_win_rule",
    "two_room-break_stop-goto_win-distr_obj_rule",
    "two_room-break_stop-goto_win-distr_obj",
    "two_room-break_stop-goto_win-distr_rule",
    "two_room-break_stop-goto_win-distr_obj-irrelevant_rule",
    "two_room-break_stop-goto_win",
    "two_room-maybe_break_stop-goto_win-distr_obj_rule",
    "two_room-maybe_break_stop-goto_win",
    "two_room-maybe_break_stop-goto_win-distr_obj",
    "two_room-maybe_break_stop-goto_win-distr_rule",
    "two_room-maybe_break_stop-goto_win-distr_obj-irrelevant_rule",
    "two_room-make_win-distr_obj_rule",
    "two_room-make_win-distr_rule",
    "two_room-make_win",
    "two_room-make_win-distr_obj-irrelevant_rule",
    "two_room-make_win-distr_obj",
    "two_room-make_win-distr_win_rule",
    "two_room-break_stop-make_win-distr_obj_rule",
    "two_room-break_stop-make_win-distr_rule",
    "two_room-break_stop-make_win",
    "two_room-break_stop-make_win-distr_obj-irrelevant_rule",
    "two_room-break_stop-make_win-distr_obj",
    "two_room-make_you",
    "two_room-make_you-make_win",
    "two_room-make_wall_win",
)


def _babaisai_tasks() -> tuple[str, ...]:
    from verlog.envs.babaisai.levels import TASKS  # pure Python, no game package

    return TASKS


def _make_babaisai(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.babaisai import make

    return make(task, seed, **kwargs)


def _babaisai_bot(env: TextEnv) -> TextAgent:
    from verlog.envs.babaisai.solver import bot_answer

    return AnswerFnAgent(env, bot_answer)


register_family(EnvFamily(
    name="babaisai",
    tasks=_babaisai_tasks(),
    make=_make_babaisai,
    bot=_babaisai_bot,
    progression=babaisai_progression,
    summary="BabaIsAI rule-manipulation puzzles (verlog's re-implementation), as text",
    balrog=BalrogSettings(
        tasks=tuple((f"env/{task}", task) for task in BABAISAI_BALROG_TASKS),
        max_steps={task: 100 for task in BABAISAI_BALROG_TASKS},
        episodes_per_task=3,
        invalid_action="idle",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("babaisai", (None, name)),
    ),
))

# --------------------------------------------------------------------------------------------
# Crafter (verlog/envs/crafter/env.py)


def _make_crafter(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.crafter.env import CrafterTextEnv

    return CrafterTextEnv(seed, **kwargs)


def _crafter_bot(env: TextEnv) -> TextAgent:
    from verlog.envs.crafter.env import BalrogCrafterScriptedAgent, CrafterScriptedAgent, CrafterTextEnv

    if isinstance(env, CrafterTextEnv) and env.balrog:
        return BalrogCrafterScriptedAgent(env)
    return CrafterScriptedAgent()


register_family(EnvFamily(
    name="crafter",
    tasks=(),
    make=_make_crafter,
    bot=_crafter_bot,
    progression=crafter_progression,
    summary="Crafter, the 2D survival game, as text",
    balrog=BalrogSettings(
        tasks=(("default", ""),),
        max_steps={"": 2000},
        episodes_per_task=10,
        invalid_action="Noop",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("crafter", (name,)),
    ),
))

# --------------------------------------------------------------------------------------------
# TextWorld (verlog/envs/textworld/env.py)

TEXTWORLD_GAMES: tuple[str, ...] = ("treasure_hunter", "coin_collector", "cooking")


def _make_textworld(task: str, seed: int | None, **kwargs: Any) -> TextEnv:
    from verlog.envs.textworld.env import TextWorldTextEnv

    return TextWorldTextEnv(task, seed, **kwargs)


def _textworld_games(source: BalrogSource, name: str) -> dict[str, Any]:
    """BALROG's own game files of the task (from the user's BALROG), played instead of verlog's pool."""
    return {"game_files": tuple(str(path) for path in source.textworld_games(name))}


def _textworld_bot(env: TextEnv) -> TextAgent:
    from verlog.envs.textworld.env import TextWorldTextEnv, TextWorldWalkthroughAgent

    assert isinstance(env, TextWorldTextEnv)
    return TextWorldWalkthroughAgent(env)


register_family(EnvFamily(
    name="textworld",
    tasks=TEXTWORLD_GAMES,
    make=_make_textworld,
    bot=_textworld_bot,
    progression=textworld_progression,
    summary="TextWorld's generated text adventures",
    balrog=BalrogSettings(
        tasks=(
            ("treasure_hunter", "treasure_hunter"),
            ("the_cooking_game", "cooking"),
            ("coin_collector", "coin_collector"),
        ),
        max_steps={game: 80 for game in TEXTWORLD_GAMES},
        episodes_per_task=10,
        invalid_action=None,  # every answer is a command: the game itself answers a bad one
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("textworld", (None, name)),
        source_kwargs=_textworld_games,
    ),
))

# --------------------------------------------------------------------------------------------
# MiniHack and NetHack (verlog/envs/nle/env.py)

#: BALROG's MiniHack tasks that run offline
MINIHACK_TASKS: tuple[str, ...] = (
    "MazeWalk-9x9",
    "MazeWalk-15x15",
    "Corridor-R3",
    "CorridorBattle-Dark",
    "Quest-Easy",
    "Quest-Medium",
)
MINIHACK_LEFT_OUT: dict[str, str] = {
    "Boxoban-Hard": "its levels are downloaded at run time, impossible offline",
    "Boxoban-Medium": "its levels are downloaded at run time, impossible offline",
}


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


register_family(EnvFamily(
    name="minihack",
    tasks=MINIHACK_TASKS,
    make=_make_minihack,
    bot=_minihack_bot,
    progression=minihack_progression,
    left_out=MINIHACK_LEFT_OUT,
    summary="MiniHack tasks (NetHack Learning Environment), as text",
    balrog=BalrogSettings(
        tasks=tuple((f"MiniHack-{task}-v0", task) for task in MINIHACK_TASKS),
        max_steps={task: 100 for task in MINIHACK_TASKS},
        episodes_per_task=5,
        invalid_action="north",
        env_kwargs={"protocol": "balrog"},
        left_out={f"MiniHack-{task}-v0": why for task, why in MINIHACK_LEFT_OUT.items()},
        prompt=_minihack_prompt,
    ),
))

register_family(EnvFamily(
    name="nethack",
    tasks=(),
    make=_make_nethack,
    progression=nethack_progression,
    summary="NetHack (the NetHack Challenge), as text",
    balrog=BalrogSettings(
        tasks=(("NetHackChallenge-v0", ""),),
        max_steps={"": 100_000},
        episodes_per_task=5,
        invalid_action="esc",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("nle"),
    ),
))
