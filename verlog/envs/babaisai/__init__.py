"""BabaIsAI: the rule-manipulation puzzle benchmark (Cloos et al., 2024), re-implemented.

``make(task, seed)`` builds a :class:`BabaIsAIEnv` for one task family from :data:`TASKS`
(e.g. ``"two_room-maybe_break_stop-goto_win"``). Modules: :mod:`.game` (engine and rules),
:mod:`.levels` (seeded level generators), :mod:`.env` (the text environment), :mod:`.solver`
(BFS solver and text-playing bot).
"""

from __future__ import annotations

from typing import Any

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


__all__ = [
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
