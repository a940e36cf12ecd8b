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

from verlog.envs.agent_graph import build_env_graph
from verlog.envs import check_protocol, get_family

GAMES = ("treasure_hunter", "coin_collector", "cooking")


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
):
    """The TextWorld agent for ``game``; ``settings`` overrides the generator's (e.g.
    ``{"level": 30}``). ``history_turns`` and ``max_tokens`` default to the protocol's (verlog:
    1 and the model's own; BALROG: 16 and 8,192). ``balrog_source``: your BALROG checkout (default
    ``$VERLOG_BALROG``), whose wording and game files ``protocol="balrog"`` then uses."""
    if game not in GAMES:
        raise ValueError(f"unknown TextWorld game {game!r}; valid: {', '.join(GAMES)}")
    if check_protocol(protocol) == "balrog":
        balrog = get_family("textworld").balrog
        history_turns = balrog.history_length if history_turns is None and balrog else history_turns
        max_tokens = balrog.max_tokens if max_tokens is None and balrog else max_tokens
    return build_env_graph(
        model, f"textworld:{game}", history_turns=1 if history_turns is None else history_turns,
        max_tokens=max_tokens, protocol=protocol, balrog_source=balrog_source,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty, **(settings or {})},
    )
