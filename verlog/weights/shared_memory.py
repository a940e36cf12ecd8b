"""Models moved to shared memory, for the processes that work on the same tensors (the update
processes, the engine's process): a child changes, or reads, the very tensors of the trainer.

Shared memory on Linux is ``/dev/shm``; a container often gives it 64 MiB (Docker's default), far
less than a model: :func:`share_models` checks the room first and says what to change, instead of
the child dying of a bus error half-way.
"""

from __future__ import annotations

import os

from torch import nn

__all__ = ["share_models", "unshared_bytes"]

SHM = "/dev/shm"


def unshared_bytes(*models: nn.Module | None) -> int:
    """The bytes of the models' parameters and buffers not yet in shared memory (a tensor shared
    by two models counts once)."""
    seen: set[int] = set()
    total = 0
    for model in models:
        if model is None:
            continue
        for t in [*model.parameters(), *model.buffers()]:
            storage = t.untyped_storage()
            if t.device.type == "cpu" and not storage.is_shared() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def share_models(*models: nn.Module | None, purpose: str) -> None:
    """Move the models' tensors to shared memory (in place: the modules keep working as before),
    after checking that ``/dev/shm`` has room for them; ``purpose`` names the feature in the error."""
    needed = unshared_bytes(*models)
    if needed and os.path.isdir(SHM):
        stat = os.statvfs(SHM)
        free = stat.f_bavail * stat.f_frsize
        if needed > free:
            raise RuntimeError(
                f"{purpose} needs {needed / 2**20:.0f} MiB of shared memory for the model's tensors and {SHM} has "
                f"{free / 2**20:.0f} MiB free: give the machine more (docker run --shm-size=...; Kubernetes: an "
                "emptyDir of medium Memory at /dev/shm), or turn the feature off"
            )
    for model in models:
        if model is not None:
            model.share_memory()
