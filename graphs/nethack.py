"""NetHack played as text (verlog/envs/nle/env.py): the NetHack Challenge (``NetHackChallenge-v0``).

Reward is the in-game score gained; BALROG's progression (deepest level and highest experience
level reached) is in ``info["progression"]``.

``protocol="verlog"`` (training): the agent reads the game's messages (prompts its action does
not answer are answered for it, and it is told), status, what lies in each compass direction,
what else is on the map with direction and distance, and its inventory; it answers with
reasoning and ``ACTION: <action>`` (``far east``, ``go down``, ``search``, ``eat f`` ...); an
answer without a valid action runs ``esc`` and costs 0.1. ``protocol="balrog"``: BALROG's text
(message, language observation, cursor, full ASCII map, inventory), one key per answer (the model
answers the game's questions itself), 100,000 steps with the 150-step no-progress abort, 16 past
observations and 8,192-token answers; an invalid answer runs ``esc`` and costs nothing, as in
BALROG (``invalid_action_penalty`` defaults to the protocol's: 0.1 for verlog's, 0 for BALROG's).
"""

from __future__ import annotations

from typing import Any

from verlog.envs import check_protocol
from verlog.envs.agent_graph import build_game_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the game seeded with it."""
    return {"seed": seed}


def build_graph(
    model,
    protocol: str = "verlog",
    history_turns: int | None = None,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float | None = None,
    show_map: bool = False,
    balrog_source: Any = None,
    max_image_history: int = 0,
):
    """The NetHack agent; ``max_steps`` caps the episode (BALROG: 100,000), ``show_map`` adds
    the ASCII map to verlog's observation. ``history_turns`` and ``max_tokens`` default to the
    protocol's; ``balrog_source``: your BALROG checkout (default ``$VERLOG_BALROG``), whose
    wording ``protocol="balrog"`` then uses; ``max_image_history`` above 0: BALROG's vision
    protocol (the map's image beside the text; BALROG's VLM mode: 1)."""
    verlog_only = {"show_map": show_map} if check_protocol(protocol) == "verlog" else {}  # BALROG's text has the map
    return build_game_graph(
        model,
        "nethack",
        protocol=protocol,
        history_turns="default" if history_turns is None else history_turns,
        max_tokens="default" if max_tokens is None else max_tokens,
        max_steps=max_steps,
        invalid_action_penalty=invalid_action_penalty,
        balrog_source=balrog_source,
        max_image_history=max_image_history,
        **verlog_only,
    )
