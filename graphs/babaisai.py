"""BabaIsAI played as text (verlog/envs/babaisai): push word blocks to make and break rules.

``protocol: verlog`` (default, the training variant): the agent sees the active rules and every
object and word block relative to itself; it answers with reasoning and
``ACTION: <idle|up|down|left|right>``. Reward 1 for reaching a WIN object (cap 100 steps); an
answer without a valid action costs 0.1. ``protocol: balrog``: BALROG's text, prompt (16 past
observations), answer rule and the original game's rules (stacks, win check, a new level when
nothing is YOU; see docs/environments_balrog.md).
"""

from __future__ import annotations

from typing import Any

from verlog.envs import get_family
from verlog.envs.agent_graph import build_game_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the level generated from that seed."""
    return {"seed": seed}


def build_graph(model, task: str = "goto_win-distr_obj", protocol: str = "verlog", **settings: Any):
    """The BabaIsAI agent for ``task`` (one of BabaIsAI's 40 tasks); ``settings``: ``history_turns``,
    ``max_tokens``, ``max_steps``, ``invalid_action_penalty``, ``show_border``, ``ensure_solvable``,
    ``balrog_source`` (your BALROG checkout, whose wording ``protocol="balrog"`` then uses; default
    ``$VERLOG_BALROG``), ``max_image_history`` (above 0: BALROG's vision protocol, the level as an
    image beside the text; BALROG's VLM mode: 1)."""
    tasks = get_family("babaisai").tasks
    if task not in tasks:
        raise ValueError(f"unknown BabaIsAI task {task!r}; valid: {', '.join(tasks)}")
    return build_game_graph(model, f"babaisai:{task}", protocol=protocol, **settings)
