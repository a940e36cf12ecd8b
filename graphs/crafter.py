"""Crafter played as text (verlog/envs/crafter_env.py): survive, collect, craft.

The agent sees what is around it with directions and distances, what it faces, its status and
inventory; it answers with reasoning and ``ACTION: <one of 17 actions>``. Reward is Crafter's
own (+1 per new achievement, health changes); episodes run for hundreds of turns (cap 400).
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the world generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
):
    """The Crafter agent."""
    return build_env_graph(
        model, "crafter", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty},
    )
