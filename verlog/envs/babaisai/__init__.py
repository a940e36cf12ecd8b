"""BabaIsAI: the rule-manipulation puzzle benchmark (Cloos et al., 2024), re-implemented.

``make(task, seed)`` builds a :class:`BabaIsAIEnv` for one task family from :data:`TASKS`
(e.g. ``"two_room-maybe_break_stop-goto_win"``). Modules: :mod:`.game` (engine and rules),
:mod:`.levels` (seeded level generators), :mod:`.env` (the text environment), :mod:`.solver`
(BFS solver and text-playing bot). This module also declares the environment family
(:data:`FAMILY`, with BALROG's task list :data:`BALROG_TASKS`).
"""

from __future__ import annotations

from typing import Any

from verlog.envs.balrog_source import PromptCall
from verlog.envs.base import AnswerFnAgent, TextAgent, TextEnv
from verlog.envs.family import BalrogSettings, EnvFamily
from verlog.envs.progression import won_progression

from .env import SYNONYMS, BabaIsAIEnv, describe
from .game import ACTIONS, GameState, render_ascii, state_from_map, step
from .levels import TASKS, Level, generate
from .solver import bot_actions, bot_answer, play_bot_episode, solve

#: the task combinations Verlog reports results on
VERLOG_TASKS: tuple[str, ...] = (
    "goto_win-distr_obj",
    "two_room-goto_win",
    "two_room-goto_win-distr_obj_rule",
    "two_room-maybe_break_stop-goto_win",
)


def make(task: str, seed: int | None = None, **kwargs: Any) -> BabaIsAIEnv:
    """A BabaIsAI environment for ``task``; ``kwargs`` go to :class:`BabaIsAIEnv`
    (``max_steps``, ``invalid_action_penalty``, ``show_border``, ``ensure_solvable``).
    Raises ``ValueError`` naming the valid tasks when ``task`` is unknown."""
    if task not in TASKS:
        raise ValueError(f"unknown BabaIsAI task {task!r}; valid tasks: {', '.join(TASKS)}")
    return BabaIsAIEnv(task=task, seed=seed, **kwargs)


#: BALROG's 40 BabaIsAI tasks, in its order (its names carry an ``env/`` prefix)
BALROG_TASKS: tuple[str, ...] = (
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


def _bot(env: TextEnv) -> TextAgent:
    return AnswerFnAgent(env, bot_answer)


FAMILY = EnvFamily(
    name="babaisai",
    tasks=TASKS,
    make=make,
    bot=_bot,
    progression=won_progression,
    summary="BabaIsAI rule-manipulation puzzles (verlog's re-implementation), as text",
    balrog=BalrogSettings(
        tasks=tuple((f"env/{task}", task) for task in BALROG_TASKS),
        max_steps={task: 100 for task in BALROG_TASKS},
        episodes_per_task=3,
        invalid_action="idle",
        env_kwargs={"protocol": "balrog"},
        prompt=lambda env, name: PromptCall("babaisai", (None, name)),
    ),
)

__all__ = [
    "BALROG_TASKS",
    "FAMILY",
    "ACTIONS",
    "SYNONYMS",
    "TASKS",
    "VERLOG_TASKS",
    "BabaIsAIEnv",
    "GameState",
    "Level",
    "bot_actions",
    "bot_answer",
    "describe",
    "generate",
    "make",
    "play_bot_episode",
    "render_ascii",
    "solve",
    "state_from_map",
    "step",
]
