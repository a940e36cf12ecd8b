"""Per-call sampling seeds: each model call of an episode samples from a random stream of its own,
named by the episode and the call's place in it, so that the same episode draws the same tokens
however many episodes run beside it, in whatever order their calls reach the engine.

The chat model cannot tell which episode a call belongs to, or which of its calls it is; the
episode's recorder can (it sees every call start, in LangGraph's order). So the recorder names the
seed of each call as the call starts (:func:`assign_call_seed`, keyed by the call's LangChain run
id) and the chat model reads it when it builds the engine request (:func:`call_seed_of`): the
embedded engine samples the request from a stream of its own that starts there, SGLang gets it as
``sampling_seed``, an OpenAI-compatible endpoint as ``seed``. A seed the call gives itself
(``bind(seed=...)``, the model's ``seed``) is kept.

A call's seed is :func:`derive_seed` of the episode's sampling key (evaluation: the episode's
id, i.e. its task and seed or row; training: ``rollout.seed`` and the slot's episode counter)
and the call's place: the LangGraph node it runs in (superstep and task path, level by level
through sub-graphs) and how many calls were made at that place before it. Parallel branches
therefore keep their own seeds whichever of them starts first, and a retried node's calls draw
afresh.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any
from uuid import UUID

__all__ = ["assign_call_seed", "call_seed_of", "derive_seed", "release_call_seed"]

_SEEDS: dict[UUID, int] = {}
_LOCK = threading.Lock()  # calls start and end on any thread (sync nodes run in executors)


def derive_seed(*parts: Any) -> int:
    """A seed in ``[0, 2**63)`` (a non-negative signed 64-bit integer, as every engine takes) that
    depends only on ``parts`` (numbers, strings and tuples of them): the same on every run and
    every machine, unlike Python's ``hash``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def assign_call_seed(run_id: UUID, seed: int) -> None:
    """Name the sampling seed of the model call whose LangChain run id is ``run_id``."""
    with _LOCK:
        _SEEDS[run_id] = seed


def call_seed_of(run_id: UUID | None) -> int | None:
    """The seed named for the call ``run_id`` (``None``: no recorder named one)."""
    if run_id is None:
        return None
    with _LOCK:
        return _SEEDS.get(run_id)


def release_call_seed(run_id: UUID) -> None:
    """Forget the seed of a call that has ended."""
    with _LOCK:
        _SEEDS.pop(run_id, None)
