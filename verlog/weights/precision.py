"""Mixed precision for training: float32 master weights, forward passes under ``torch.autocast``.

AdamW's first steps move every weight by about the learning rate (``lr * m / sqrt(v)``, with
``|m / sqrt(v)|`` near 1). bfloat16 keeps 8 bits of mantissa, so a weight of magnitude ``w``
only changes when the step exceeds ``w / 256``: at lr 1e-6 that is almost never (on
SmolLM2-135M one step changed 0.39 % of the weights, against 100 % in float32). The standard
recipe, used here, keeps the weights and the optimizer's moments in float32 and runs the forward
passes under autocast: matrix products in bfloat16, softmaxes, norms and losses in float32.

float16 keeps more mantissa (10 bits) but has a narrow exponent range:
small gradients underflow to zero. Its backward passes run on a scaled loss (``GradScaler``), the
gradients are unscaled before clipping, and a step whose gradients overflowed is skipped while
the scale comes down. The scale is not checkpointed: a resumed run starts again from
``GradScaler``'s initial scale and finds its level within a few skipped steps.

On a CPU the trainer's thread treats subnormal floats as zero (:func:`flush_subnormals`): a
sharpening policy's backward passes fill with them, and a CPU computes them many times slower.

Config: ``model.dtype`` is the weights' dtype (training refuses anything but float32),
``model.autocast`` the compute dtype (``none``, ``bfloat16``, ``float16``).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

__all__ = [
    "AUTOCAST_DTYPES",
    "MASTER_DTYPE",
    "autocast",
    "autocast_dtype",
    "check_master_dtype",
    "flush_subnormals",
    "grad_scaler",
]

#: ``model.autocast`` values and the compute dtype each one means
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: the only weight dtype training steps
MASTER_DTYPE = "float32"


def autocast_dtype(name: str) -> torch.dtype | None:
    """The compute dtype ``model.autocast`` names (``None``: plain float32 passes)."""
    if name not in AUTOCAST_DTYPES:
        raise ValueError(f"model.autocast: {name!r} is not one of {', '.join(AUTOCAST_DTYPES)}")
    return AUTOCAST_DTYPES[name]


def check_master_dtype(dtype: str, autocast_name: str) -> None:
    """Refuse to train weights stored in less than float32 (they would barely move), saying what
    to set instead."""
    if dtype != MASTER_DTYPE:
        suggestion = autocast_name if autocast_name != "none" else dtype
        raise ValueError(
            f"model.dtype: training keeps float32 master weights, got {dtype!r} (AdamW on {dtype} weights at lr 1e-6 "
            f"leaves almost all of them unchanged); set model.dtype: float32 and model.autocast: {suggestion} to "
            f"compute in {suggestion}"
        )


def autocast(device: torch.device, dtype: torch.dtype | None) -> ContextManager:
    """``torch.autocast`` on ``device`` to ``dtype``; nothing for ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    """A loss scaler for float16 compute (``None`` otherwise: bfloat16 has float32's range)."""
    if dtype != torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def flush_subnormals(device: torch.device) -> bool:
    """On a CPU, have this thread's passes treat subnormal floats as zero; returns whether it did.

    As a policy sharpens, its backward passes fill with subnormal numbers (the softmax of answers
    it has all but ruled out), which a CPU computes many times slower: a ``sokoban-words`` run's
    updates went from 4.6 s to 18.5 s over 288 updates, and back to 4.6 s when resumed with
    subnormals flushed (its actor's forward and backward pass: 387 ms, 222 ms flushed, 217 ms at
    the start). Values that small (below 1.2e-38) change no sum a loss is made of. The setting
    is the calling thread's (the trainer's, where its passes run with ``torch_threads: 1``), and
    stays set for that thread after training."""
    if device.type != "cpu":
        return False
    return bool(torch.set_flush_denormal(True))
