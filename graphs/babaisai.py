"""BabaIsAI played as text (verlog/envs/babaisai): push word blocks to make and break rules.

The agent sees the active rules and every object and word block relative to itself; it answers
with reasoning and ``ACTION: <idle|up|down|left|right>``. Reward 1 for reaching a WIN object
(episode cap 100 steps); an answer without a valid action costs 0.1.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    task: str = "goto_win-distr_obj",
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
):
    """The BabaIsAI agent for ``task`` (see ``verlog.envs.babaisai.TASKS``)."""
    from verlog.envs.babaisai import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown BabaIsAI task {task!r}; valid: {', '.join(TASKS)}")
    return build_env_graph(
        model, f"babaisai:{task}", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty},
    )
