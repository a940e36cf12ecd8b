"""Rules about token ids that the engine, the trainers and verl's agent loop all apply.

* :func:`pad_token_id`: the id that fills padding (never trained on, never attended to): the
  tokenizer's pad token; without one its end-of-sequence token; else 0.
* :func:`common_prefix_len`: how many leading tokens some sequences share (the engine computes a
  shared prompt start once; the trainer's forward pass packs rows behind a shared prefix).
* :func:`encode_plain`: the ids of a rendered prompt (no special tokens added), as the tokenizer's
  own call gives them, without its per-call overhead where nothing can make them differ.

Torch-free, so any layer can import it.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

__all__ = ["common_prefix_len", "encode_plain", "pad_token_id"]


def _first_id(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in value if isinstance(v, int)), None)
    return None


def pad_token_id(tokenizer: Any, eos_ids: Iterable[int] = ()) -> int:
    """The padding id of ``tokenizer``: its ``pad_token_id``; without one its ``eos_token_id``
    (the first of a list), then the first of ``eos_ids`` (e.g. the generation config's); else 0."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        list(eos_ids),
    ):
        found = _first_id(candidate)
        if found is not None:
            return found
    return 0


def common_prefix_len(seqs: Sequence[Sequence[int]], limit: int | None = None) -> int:
    """How many leading tokens all of ``seqs`` share, at most ``limit`` (``None``: the shortest
    sequence's length). ``0`` for no sequences."""
    if not seqs:
        return 0
    first = seqs[0]
    bound = min(len(s) for s in seqs)
    if limit is not None:
        bound = min(bound, limit)
    n = 0
    while n < bound and all(s[n] == first[n] for s in seqs[1:]):
        n += 1
    return n


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False)["input_ids"]``, exactly.

    A fast tokenizer encodes ``text`` straight through its Rust backend (what that call does
    after its Python bookkeeping, about half its cost for a prompt) when the backend holds no
    setting the call would change first: no truncation, no padding, special tokens not split.
    Any other tokenizer, or a backend with such a setting, goes through the call itself.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is None
        or backend.truncation is not None
        or backend.padding is not None
        or getattr(backend, "encode_special_tokens", False)
        or getattr(tokenizer, "split_special_tokens", False)
    ):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return backend.encode(text, add_special_tokens=False).ids
