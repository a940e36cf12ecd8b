"""MiniHack played as text (verlog/envs/nle_env.py): BALROG's MiniHack tasks that run offline.

Tasks: ``MazeWalk-9x9``, ``MazeWalk-15x15``, ``Corridor-R3``, ``CorridorBattle-Dark``,
``Quest-Easy``, ``Quest-Medium`` (Boxoban needs a download and is left out). The agent reads the
game's messages, status, what lies in each compass direction and what else is on the map with
direction and distance, and its inventory; it answers with reasoning and ``ACTION: <action>``
(``north``, ``open east``, ``zap f east`` ...). Reward 1 for reaching the goal (episode cap 100
steps, BALROG's); an answer without a valid action runs ``north`` and costs 0.1.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph

TASKS = ("MazeWalk-9x9", "MazeWalk-15x15", "Corridor-R3", "CorridorBattle-Dark", "Quest-Easy", "Quest-Medium")


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    task: str = "MazeWalk-9x9",
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    show_map: bool = False,
):
    """The MiniHack agent for ``task``; ``show_map`` adds the ASCII map to each observation."""
    if task not in TASKS:
        raise ValueError(
            f"unknown MiniHack task {task!r}; valid: {', '.join(TASKS)} "
            "(Boxoban-Hard and Boxoban-Medium are left out: their levels are downloaded at run time)"
        )
    return build_env_graph(
        model, f"minihack:{task}", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty, "show_map": show_map},
    )
