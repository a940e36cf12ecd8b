"""Crafter played as text (verlog/envs/crafter/env.py): survive, collect, craft.

The agent sees what is around it with directions and distances, what it faces, its status and
inventory; it answers with reasoning and ``ACTION: <one of 17 actions>``. Reward is Crafter's
own (+1 per new achievement, health changes); episodes run for hundreds of turns (cap 400).
``protocol: balrog`` plays Crafter as BALROG does: its text and action names (``Move West``),
exact-match answers (``Noop`` otherwise), its prompt (16 past observations), answer budget and
2,000-step cap (see docs/environments_balrog.md).
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_game_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the world generated from that seed."""
    return {"seed": seed}


def build_graph(model, protocol: str = "verlog", **settings: Any):
    """The Crafter agent; ``settings``: ``history_turns``, ``max_tokens``, ``max_steps``,
    ``invalid_action_penalty``, ``max_per_type``, ``balrog_source`` (your BALROG checkout, whose
    wording ``protocol="balrog"`` then uses; default ``$VERLOG_BALROG``), ``max_image_history``
    (above 0: BALROG's vision protocol, the game's frame beside the text; BALROG's VLM mode: 1)."""
    return build_game_graph(model, "crafter", protocol=protocol, **settings)
