"""Wording shared by the games' text observations."""

from __future__ import annotations


def count(n: int, word: str) -> str:
    """``count(1, "step") == "1 step"``, ``count(3, "step") == "3 steps"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def offset_phrase(*axes: tuple[int, str, str], here: str = "here") -> str:
    """Words for an offset along some axes, each given as ``(amount, positive word, negative word)``.

    ``offset_phrase((2, "right", "left"), (-1, "down", "up")) == "2 steps right and 1 step up"``.
    """
    parts = [f"{count(abs(v), 'step')} {pos if v > 0 else neg}" for v, pos, neg in axes if v]
    return " and ".join(parts) if parts else here
