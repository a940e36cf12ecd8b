"""TextWorld played as text (verlog/envs/textworld/env.py): BALROG's three generated games.

Games: ``treasure_hunter`` (find the named object behind doors and locks), ``coin_collector``
(find the coin), ``cooking`` (gather, cut and cook a recipe's ingredients, then eat the meal).
Each seed plays one generated (and cached) game; episodes last at most 80 commands (BALROG's cap)
and the reward is the score gained.

``protocol="verlog"`` (training): the agent reads the game's text, its location, inventory,
score and the valid commands, with the goal in the instruction, and answers with reasoning and
``ACTION: <command>``; one past exchange is shown. ``protocol="balrog"``: BALROG's games and
prompt (the game's text only, the goal removed, free-text commands, 16 past observations,
8,192-token answers; see docs/environments_balrog.md).
"""

from __future__ import annotations

from typing import Any

from verlog.envs import get_family
from verlog.envs.agent_graph import build_game_graph

GAMES = get_family("textworld").tasks


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the game of that seed."""
    return {"seed": seed}


def build_graph(
    model,
    game: str = "coin_collector",
    protocol: str = "verlog",
    history_turns: int | None = None,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    settings: dict[str, Any] | None = None,
    balrog_source: Any = None,
    max_image_history: int = 0,
):
    """The TextWorld agent for ``game``; ``settings`` overrides the generator's (e.g.
    ``{"level": 30}``). ``history_turns`` and ``max_tokens`` default to the protocol's (verlog:
    1 and the model's own; BALROG: 16 and 8,192). ``balrog_source``: your BALROG checkout (default
    ``$VERLOG_BALROG``), whose wording and game files ``protocol="balrog"`` then uses;
    ``max_image_history``: BALROG's vision protocol (TextWorld has no image: only its history
    window, ``2 * max(history_turns, max_image_history)`` events, follows it)."""
    if game not in GAMES:
        raise ValueError(f"unknown TextWorld game {game!r}; valid: {', '.join(GAMES)}")
    return build_game_graph(
        model,
        f"textworld:{game}",
        protocol=protocol,
        history_turns="default" if history_turns is None else history_turns,
        max_tokens="default" if max_tokens is None else max_tokens,
        max_steps=max_steps,
        invalid_action_penalty=invalid_action_penalty,
        balrog_source=balrog_source,
        max_image_history=max_image_history,
        **(settings or {}),
    )
