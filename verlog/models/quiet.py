"""Quiet model I/O: transformers' progress bars off while verlog builds, loads or saves a model."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

__all__ = ["quiet_progress_bars"]


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' progress bars (e.g. "Writing model shards") inside the block."""
    from transformers.utils import logging as hf_logging

    were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_on:
            hf_logging.enable_progress_bar()
