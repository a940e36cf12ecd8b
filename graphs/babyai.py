"""BabyAI played as text (verlog/envs/babyai.py): go to, pick up, pick up then go to, open.

The agent sees the game's instructions, its previous observation and answer, and the current
observation; it answers with reasoning and ``ACTION: <action>``. Reward 1 for completing the
mission (episode cap 128 steps); an answer without a valid action costs 0.1.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph

TASKS = ("goto", "pickup", "pick_up_seq_go_to", "open")


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    task: str = "goto",
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
):
    """The BabyAI agent for ``task`` (one of goto, pickup, pick_up_seq_go_to, open)."""
    if task not in TASKS:
        raise ValueError(f"unknown BabyAI task {task!r}; valid: {', '.join(TASKS)}")
    return build_env_graph(
        model, f"babyai:{task}", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty},
    )
