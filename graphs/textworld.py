"""TextWorld played as text (verlog/envs/textworld_env.py): BALROG's three generated games.

Games: ``treasure_hunter`` (find the named object behind doors and locks), ``coin_collector``
(find the coin), ``cooking`` (gather, cut and cook a recipe's ingredients, then eat the meal).
Each seed generates (and caches) one game. The agent reads the game's text, its location,
inventory, score and the valid commands, and answers with reasoning and ``ACTION: <command>``.
Reward is the score gained (win at the goal); episodes last at most 80 commands (BALROG's cap).
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph

GAMES = ("treasure_hunter", "coin_collector", "cooking")


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the game generated from that seed."""
    return {"seed": seed}


def build_graph(
    model,
    game: str = "coin_collector",
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    settings: dict[str, Any] | None = None,
):
    """The TextWorld agent for ``game``; ``settings`` overrides the generator's (e.g. ``{"level": 30}``)."""
    if game not in GAMES:
        raise ValueError(f"unknown TextWorld game {game!r}; valid: {', '.join(GAMES)}")
    return build_env_graph(
        model, f"textworld:{game}", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty, **(settings or {})},
    )
