"""The rollout's own copy of the actor, for overlapped updates.

With ``trainer.overlap`` the engine keeps generating while the trainer changes the actor's weights,
so it cannot share the actor module: it serves :func:`rollout_copy`, which holds its own tensors
for the parameters the trainer changes (all of them, or the last layers and LoRA adapters) and
shares the frozen ones. :func:`publish_weights` copies the trained parameters into it, under the
engine's weights lock, between two decode steps.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["publish_weights", "rollout_copy"]


def rollout_copy(actor: nn.Module) -> nn.Module:
    """A copy of ``actor`` in eval mode whose trainable parameters are its own tensors and whose
    frozen parameters and buffers are the actor's (no memory spent on them)."""
    shared = {id(p): p for p in actor.parameters() if not p.requires_grad}
    shared |= {id(b): b for b in actor.buffers()}
    clone = copy.deepcopy(actor, memo=dict(shared))
    clone.requires_grad_(False)
    return clone.eval()


@torch.no_grad()
def publish_weights(actor: nn.Module, clone: nn.Module) -> int:
    """Copy the actor's trainable parameters into its :func:`rollout_copy`; returns how many
    elements were copied. Hold the engine's weights lock meanwhile."""
    copied = 0
    for source, target in zip(actor.parameters(), clone.parameters(), strict=True):
        if source.requires_grad and source is not target:
            target.copy_(source)
            copied += source.numel()
    return copied
