"""Rules about token ids that the engine, the trainers and verl's agent loop all apply.

* :func:`pad_token_id`: the id that fills padding (never trained on, never attended to): the
  tokenizer's pad token; without one its end-of-sequence token; else 0.
* :func:`eos_token_ids`: the ids that end a response: the tokenizer's end-of-sequence token and
  the model's generation config's (the engine stops on them; a completed grammar allows only them).
* :func:`common_prefix_len`: how many leading tokens some sequences share (the engine computes a
  shared prompt start once; the trainer's forward pass packs rows behind a shared prefix).
* :func:`encode_plain`: the ids of a rendered prompt (no special tokens added), as the tokenizer's
  own call gives them, without its per-call overhead where nothing can make them differ, and
  without encoding again the pieces of a prompt that earlier prompts already had.

Torch-free, so any layer can import it.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from typing import Any, Iterable, Sequence

__all__ = ["common_prefix_len", "encode_plain", "eos_token_ids", "pad_token_id"]


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


def _id_set(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, (list, tuple, set)):
        return {v for v in value if isinstance(v, int)}
    return set()


def eos_token_ids(tokenizer: Any, model: Any = None) -> tuple[int, ...]:
    """The ids that end a response, sorted: ``tokenizer.eos_token_id`` and those of
    ``model.generation_config`` (one id or a list each; either may be missing)."""
    eos = _id_set(getattr(tokenizer, "eos_token_id", None))
    eos |= _id_set(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    return tuple(sorted(eos))


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


class _PieceEncoder:
    """A fast tokenizer's plain encoding, remembered piece by piece.

    A fast tokenizer first cuts the text at its added tokens (``<|im_start|>`` and the like),
    then normalizes and pre-tokenizes each piece between them on its own: the ids of a text are
    the ids of its pieces, in order, with each added token's id between them. A rendered prompt
    repeats most of its pieces from call to call (the system prompt, earlier messages, the
    template's role headers), so each piece's ids are kept (:data:`PIECE_CACHE_SIZE` pieces of at
    most :data:`PIECE_MAX_CHARS` characters, the least recently used dropped first) and only new
    pieces reach the backend.

    Only built for a backend where this holds exactly (see :meth:`build`): added tokens that
    strip no whitespace, match whole text (``single_word`` off) and are matched before
    normalization, and no pre-tokenizer or normalizer that treats the first piece differently
    (``Metaspace``, ``Prepend``: SentencePiece-style prefixes).
    """

    def __init__(self, backend: Any, added: dict[str, int]):
        self.backend = backend
        self.added = added
        #: how many added tokens the backend had (a token added since makes this encoder stale)
        self.added_count = len(backend.get_added_tokens_decoder())
        # longest first: at the leftmost place two added tokens could start, the longer one wins,
        # as the backend's leftmost-longest matcher has it
        alternatives = sorted(added, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(a) for a in alternatives)) if alternatives else None
        self._remembered = functools.lru_cache(maxsize=PIECE_CACHE_SIZE)(self._encode_piece)

    @classmethod
    def build(cls, backend: Any) -> "_PieceEncoder | None":
        """The encoder for ``backend``, or ``None`` where its pieces are not encoded on their own."""
        for part in (backend.normalizer, backend.pre_tokenizer):
            if part is not None and any(name in repr(part) for name in ("Metaspace", "Prepend")):
                return None
        added: dict[str, int] = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word or token.normalized or not token.content:
                return None
            added[token.content] = token_id
        return cls(backend, added)

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        return tuple(self.backend.encode(piece, add_special_tokens=False).ids)

    def piece(self, piece: str) -> tuple[int, ...]:
        """The ids of a text between added tokens (remembered unless it is very long)."""
        if len(piece) > PIECE_MAX_CHARS:
            return self._encode_piece(piece)
        return self._remembered(piece)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids: each added token's own id, the remembered ids of the pieces between."""
        if self.pattern is None:
            return list(self.piece(text))
        ids: list[int] = []
        start = 0
        for match in self.pattern.finditer(text):
            if match.start() > start:
                ids.extend(self.piece(text[start : match.start()]))
            ids.append(self.added[match.group()])
            start = match.end()
        if start < len(text):
            ids.extend(self.piece(text[start:]))
        return ids


#: how many prompt pieces (texts between added tokens) each tokenizer's plain encoding keeps,
#: and the longest piece it keeps (at most some tens of MB per tokenizer; prompts' pieces are short)
PIECE_CACHE_SIZE = 1024
PIECE_MAX_CHARS = 16_384

_ENCODERS: "weakref.WeakKeyDictionary[Any, _PieceEncoder | None]" = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def _piece_encoder(tokenizer: Any, backend: Any) -> _PieceEncoder | None:
    """``tokenizer``'s piece encoder (made on first use, remade when tokens were added since)."""
    try:
        encoder = _ENCODERS[tokenizer]
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        encoder = False
    if encoder is False or (
        encoder is not None
        and (encoder.backend is not backend or encoder.added_count != len(backend.get_added_tokens_decoder()))
    ):
        encoder = _PieceEncoder.build(backend)
        with _ENCODERS_LOCK:
            try:
                _ENCODERS[tokenizer] = encoder
            except TypeError:
                pass
    return encoder


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False)["input_ids"]``, exactly.

    A fast tokenizer encodes ``text`` through its Rust backend (skipping the call's Python
    bookkeeping) when the backend holds no setting the call would change first: no truncation,
    no padding, special tokens not split; and piece by piece, remembering each piece's ids, where
    that gives the same ids (:class:`_PieceEncoder`). Any other tokenizer, or a backend with such
    a setting, goes through the call itself.
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
    encoder = _piece_encoder(tokenizer, backend)
    if encoder is None:
        return backend.encode(text, add_special_tokens=False).ids
    return encoder.encode(text)
