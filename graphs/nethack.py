"""NetHack played as text (verlog/envs/nle_env.py): the NetHack Challenge (``NetHackChallenge-v0``).

The agent reads the game's messages (prompts it does not answer are answered for it, and it is
told), status, what lies in each compass direction, what else is on the map with direction and
distance, and its inventory; it answers with reasoning and ``ACTION: <action>`` (``far east``,
``go down``, ``search``, ``eat f`` ...). Reward is the in-game score gained; BALROG's progression
(deepest level and highest experience level reached) is in ``info["progression"]``. An answer
without a valid action runs ``esc`` and costs 0.1.
"""

from __future__ import annotations

from typing import Any

from verlog.envs.agent_graph import build_env_graph


def make_input(seed: int) -> dict[str, Any]:
    """Episode ``seed`` plays the game seeded with it."""
    return {"seed": seed}


def build_graph(
    model,
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    show_map: bool = False,
):
    """The NetHack agent; ``max_steps`` caps the episode (BALROG: 100,000), ``show_map`` adds
    the ASCII map to each observation."""
    return build_env_graph(
        model, "nethack", history_turns=history_turns, max_tokens=max_tokens,
        env_kwargs={"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty, "show_map": show_map},
    )
