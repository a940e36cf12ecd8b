"""The game a game graph's model call is made for, while the call is under way.

A game graph's policy node asks the model inside :func:`playing` with its live game, so whoever
answers the call in the same context can look at the game itself: a scripted demonstrator
(minigrid's BabyAI bot plans on the true level, the Sokoban solver on the room) answers the
graph's model calls as the oracle would (:mod:`verlog.sft.demonstrators`). A model never sees it:
it reads the prompt only. Outside a game graph's call, :func:`live_game` is ``None``.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

from verlog.envs.base import TextEnv

_LIVE_GAME: ContextVar[TextEnv | None] = ContextVar("verlog_live_game", default=None)


@contextlib.contextmanager
def playing(env: TextEnv) -> Iterator[None]:
    """While the block runs (a model call of a game graph), :func:`live_game` is ``env``."""
    token = _LIVE_GAME.set(env)
    try:
        yield
    finally:
        _LIVE_GAME.reset(token)


def live_game() -> TextEnv | None:
    """The game whose model call is being answered (``None`` outside a game graph's call)."""
    return _LIVE_GAME.get()
