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
observations and 8,192-token answers.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph
from verlog.envs import check_protocol, get_family


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the game seeded with it."""
    return {"seed": seed}


def build_graph(
    model,
    protocol: str = "verlog",
    history_turns: int | None = None,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    show_map: bool = False,
    balrog_source: Any = None,
):
    """The NetHack agent; ``max_steps`` caps the episode (BALROG: 100,000), ``show_map`` adds
    the ASCII map to verlog's observation. ``history_turns`` and ``max_tokens`` default to the
    protocol's; ``balrog_source``: your BALROG checkout (default ``$VERLOG_BALROG``), whose
    wording ``protocol="balrog"`` then uses."""
    env_kwargs: dict[str, Any] = {"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty}
    if check_protocol(protocol) == "balrog":
        balrog = get_family("nethack").balrog
        history_turns = balrog.history_length if history_turns is None and balrog else history_turns
        max_tokens = balrog.max_tokens if max_tokens is None and balrog else max_tokens
    else:
        env_kwargs["show_map"] = show_map
    return build_env_graph(
        model, "nethack", history_turns=1 if history_turns is None else history_turns,
        max_tokens=max_tokens, protocol=protocol, balrog_source=balrog_source, env_kwargs=env_kwargs,
    )
