"""Held-out levels that are held out by content, not only by seed.

A game that draws its levels from seeds is evaluated on seeds far from the training ones, but two
seeds can draw the same level: small games repeat themselves (a 6x6 Sokoban room with one box, a
BabyAI room with one object), so a "held-out" level may have been trained on. Here each level's
*content* (what defines the puzzle, without the player's start: the walls, targets and boxes of a
Sokoban room; the objects, doors and mission of a BabyAI level) falls by a hash into one of two
parts, ``share`` of the contents held out. A seed from the game's held-out start up draws a level
from the held-out part, a seed below it a level from the other: a level whose content is on the
wrong side is drawn again from a seed derived from the first (deterministic, so a seed always
means the same level). Training and evaluation then never share a level's content, and both keep
the game's own distribution of levels (the hash is blind to difficulty).
"""

from __future__ import annotations

import hashlib
from typing import Callable, TypeVar

__all__ = ["HELD_OUT_SHARE", "draw_level", "held_out_content"]

#: the share of a game's level contents held out for evaluation, by default
HELD_OUT_SHARE = 0.25
#: draws of one seed's level before giving up (a share of 0.25 needs 4 on average for held-out seeds)
MAX_DRAWS = 10_000

T = TypeVar("T")


def held_out_content(content: str, share: float) -> bool:
    """Whether a level of this content belongs to the held-out part (``share`` of all contents)."""
    digest = hashlib.sha256(content.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def derived_seed(seed: int, attempt: int) -> int:
    """The seed of a level's ``attempt``-th redraw (the seed itself first)."""
    if attempt == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/{attempt}".encode()).digest()[:4], "big")


def draw_level(
    seed: int, *, held_out: bool, share: float, draw: Callable[[int], T], content_of: Callable[[T], str]
) -> T:
    """The level of ``seed``: ``draw(seed)``, drawn again from derived seeds until its content is on
    the held-out side (``held_out``) or the other; ``share`` 0 keeps the first draw (seeds only)."""
    for attempt in range(MAX_DRAWS):
        level = draw(derived_seed(seed, attempt))
        if share <= 0 or held_out_content(content_of(level), share) == held_out:
            return level
    raise RuntimeError(
        f"no level of seed {seed} on the {'held-out' if held_out else 'training'} side after {MAX_DRAWS} draws"
    )
