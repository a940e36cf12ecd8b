"""BabyAI played as text (verlog/envs/babyai/env.py): go to, pick up, open, put next to, pick up then go to.

``protocol: verlog`` (default, the training variant): the agent sees the game's instructions, its
previous observation and answer, and the current observation; it answers with reasoning and
``ACTION: <action>``. Reward 1 for completing the mission (cap 128 steps); an answer without a
valid action costs 0.1. ``protocol: balrog``: BALROG's levels, text, prompt (16 past observations),
answer rule and caps (see docs/environments_balrog.md).
"""

from __future__ import annotations

from typing import Any

from verlog.envs import get_family
from verlog.envs.agent_graph import build_game_graph

TASKS = get_family("babyai").tasks


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(model, task: str = "goto", protocol: str = "verlog", **settings: Any):
    """The BabyAI agent for ``task`` (see ``TASKS``); ``settings``: ``history_turns``,
    ``max_tokens``, ``max_steps``, ``invalid_action_penalty``, ``layout``, ``default_action``,
    ``instruction`` (a text instead of the game's instruction, ``{mission}`` the level's mission),
    ``constrain_answers`` (each answer held to an action name by the engine),
    ``balrog_source`` (your BALROG checkout, whose wording ``protocol="balrog"`` then uses; default
    ``$VERLOG_BALROG``), ``max_image_history`` (above 0: BALROG's vision protocol, the agent's view
    as an image beside the text; BALROG's VLM mode: 1)."""
    if task not in TASKS:
        raise ValueError(f"unknown BabyAI task {task!r}; valid: {', '.join(TASKS)}")
    return build_game_graph(model, f"babyai:{task}", protocol=protocol, **settings)
