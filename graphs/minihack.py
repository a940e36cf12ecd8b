"""MiniHack played as text (verlog/envs/nle/env.py): BALROG's MiniHack tasks that run offline.

Tasks: ``MazeWalk-9x9``, ``MazeWalk-15x15``, ``Corridor-R3``, ``CorridorBattle-Dark``,
``Quest-Easy``, ``Quest-Medium`` (Boxoban needs a download and is left out). Reward 1 for
reaching the goal; episodes last at most 100 steps (BALROG's).

``protocol="verlog"`` (training): the agent reads the game's messages, status, what lies in each
compass direction and what else is on the map with direction and distance, and its inventory
(the ASCII map too with ``show_map``); it answers with reasoning and ``ACTION: <action>``
(``north``, ``open east``, ``zap f east`` ...); an answer without a valid action runs ``north``
and costs 0.1. ``protocol="balrog"``: BALROG's text (message, language observation, cursor, the
full ASCII map, inventory), its one-key actions, 16 past observations and 8,192-token answers; an
invalid answer runs ``north`` and costs nothing, as in BALROG (``invalid_action_penalty`` defaults
to the protocol's: 0.1 for verlog's, 0 for BALROG's).
"""

from __future__ import annotations

from typing import Any

from verlog.envs import check_protocol, get_family
from verlog.envs.agent_graph import build_game_graph

TASKS = get_family("minihack").tasks


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    task: str = "MazeWalk-9x9",
    protocol: str = "verlog",
    history_turns: int | None = None,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float | None = None,
    show_map: bool = False,
    balrog_source: Any = None,
    max_image_history: int = 0,
):
    """The MiniHack agent for ``task``; ``show_map`` adds the ASCII map to verlog's observation
    (BALROG's always has it). ``history_turns`` and ``max_tokens`` default to the protocol's;
    ``balrog_source``: your BALROG checkout (default ``$VERLOG_BALROG``), whose wording
    ``protocol="balrog"`` then uses; ``max_image_history`` above 0: BALROG's vision protocol (the
    map's image beside the text; BALROG's VLM mode: 1)."""
    if task not in TASKS:
        left_out = "; ".join(f"{name}: {why}" for name, why in get_family("minihack").left_out.items())
        raise ValueError(f"unknown MiniHack task {task!r}; valid: {', '.join(TASKS)} (left out: {left_out})")
    verlog_only = {"show_map": show_map} if check_protocol(protocol) == "verlog" else {}  # BALROG's text has the map
    return build_game_graph(
        model,
        f"minihack:{task}",
        protocol=protocol,
        history_turns="default" if history_turns is None else history_turns,
        max_tokens="default" if max_tokens is None else max_tokens,
        max_steps=max_steps,
        invalid_action_penalty=invalid_action_penalty,
        balrog_source=balrog_source,
        max_image_history=max_image_history,
        **verlog_only,
    )
