"""Critic pre-training schedule (Verlog): fit the value head on a large buffer before PPO starts.

A freshly initialised critic makes GAE's advantages mostly noise. Before the first policy
update, Verlog collects one big buffer of ``W`` (``buffer_multiplier``) times the usual number
of turns per batch with the initial policy, then runs ``S`` (``iterations``) critic-only
updates, each on a random subset of the buffer (a quarter by default). After those ``S``
iterations, normal PPO training (policy and critic) begins. BabyAI uses ``W = 40, S = 5``.

This object only says *what* to do (how many turns to collect, which buffer entries each
warm-up iteration uses, whether an iteration is still warm-up); the trainer does the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["CriticWarmup", "WarmupPlan"]


@dataclass(frozen=True)
class WarmupPlan:
    """What the warm-up needs: collect ``buffer_turns`` turns once, then run ``iterations``
    critic updates on ``subset_turns`` of them each."""

    buffer_turns: int
    iterations: int
    subset_turns: int


@dataclass(frozen=True)
class CriticWarmup:
    """The warm-up schedule: ``buffer_multiplier`` W, ``iterations`` S, ``subset_fraction`` of the
    buffer per iteration, and a ``seed`` that makes the subsets reproducible.

    ``CriticWarmup(40, 5).plan(batch_turns=256)`` says to collect ``40 * 256`` turns;
    ``.subsets(buffer_size)`` then yields ``S`` index tensors, each a random subset (drawn
    without replacement, independently per iteration) of a quarter of the buffer.
    ``W = 0`` or ``S = 0`` disables the warm-up.
    """

    buffer_multiplier: int = 40
    iterations: int = 5
    subset_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.buffer_multiplier < 0 or self.iterations < 0:
            raise ValueError("buffer_multiplier and iterations must be >= 0")
        if not 0.0 < self.subset_fraction <= 1.0:
            raise ValueError(f"subset_fraction must be in (0, 1], got {self.subset_fraction}")

    @property
    def enabled(self) -> bool:
        return self.buffer_multiplier > 0 and self.iterations > 0

    def subset_size(self, buffer_size: int) -> int:
        """Turns per warm-up iteration: ``subset_fraction`` of the buffer (at least 1)."""
        return max(1, math.floor(self.subset_fraction * buffer_size + 1e-9)) if buffer_size > 0 else 0

    def plan(self, batch_turns: int) -> WarmupPlan:
        """The plan for a trainer that normally collects ``batch_turns`` turns per batch."""
        if not self.enabled:
            return WarmupPlan(buffer_turns=0, iterations=0, subset_turns=0)
        buffer_turns = self.buffer_multiplier * batch_turns
        return WarmupPlan(buffer_turns, self.iterations, self.subset_size(buffer_turns))

    def subsets(self, buffer_size: int) -> Iterator[torch.Tensor]:
        """Yield ``iterations`` sorted index tensors into a buffer of ``buffer_size`` turns.

        The generator is seeded afresh at every call: the same schedule gives the same subsets.
        """
        if not self.enabled or buffer_size <= 0:
            return
        generator = torch.Generator().manual_seed(self.seed)
        size = self.subset_size(buffer_size)
        for _ in range(self.iterations):
            yield torch.randperm(buffer_size, generator=generator)[:size].sort().values

    def in_warmup(self, iteration: int) -> bool:
        """Whether training iteration ``iteration`` (0-based) is a critic-only warm-up one."""
        return self.enabled and iteration < self.iterations
