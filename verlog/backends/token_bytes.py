"""The raw bytes of each token: what a token adds to the response's UTF-8 text.

Two users: OpenAI's logprobs ``bytes`` (``verlog serve-model``) and the embedded engine's stop
strings, matched on the device against a table of every token's bytes
(:mod:`verlog.backends.stop_strings`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

__all__ = ["TokenBytes"]


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's, used by Llama 3, Qwen, SmolLM, ...): each of the 256
    byte values is written as one printable character; returns character -> byte.

    Bytes that are printable Latin-1 stand for themselves; the others (controls, space, soft
    hyphen, ...) take the characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    alphabet = {chr(b): b for b in printable}
    others = sorted(set(range(256)) - set(printable))
    alphabet.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return alphabet


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenBytes:
    """The raw bytes of a token, as OpenAI's logprobs ``bytes`` give them.

    A token that is part of a multi-byte UTF-8 character (``\xe2\x82`` of ``€``) decodes to the
    replacement character; its ``bytes`` must still be its own. Byte-level BPE vocabularies are
    read through their 256-character alphabet, SentencePiece byte-fallback pieces (``<0xE2>``)
    are their byte, added/special tokens their text; other tokens fall back to their decoded text.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.added = {
            i: getattr(t, "content", str(t))
            for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
        }
        self.byte_level = _is_byte_level(tokenizer)
        self._alphabet = _byte_level_alphabet() if self.byte_level else {}

    def __call__(self, token_id: int) -> bytes:
        return self._bytes(token_id, self.tokenizer.convert_ids_to_tokens(token_id))

    def _bytes(self, token_id: int, piece: Any) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode("utf-8")
        if isinstance(piece, str):
            if self.byte_level and all(c in self._alphabet for c in piece):
                return bytes(self._alphabet[c] for c in piece)
            fallback = _BYTE_FALLBACK.fullmatch(piece)
            if fallback:
                return bytes([int(fallback.group(1), 16)])
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def vocabulary(self, size: int) -> list[bytes]:
        """The bytes of ids ``0 .. size - 1`` (ids the tokenizer does not know have none)."""
        known = min(size, len(self.tokenizer))
        pieces = self.tokenizer.convert_ids_to_tokens(list(range(known)))
        return [self._bytes(i, p) for i, p in enumerate(pieces)] + [b""] * (size - known)


def _is_byte_level(tokenizer: Any) -> bool:
    """Whether a (fast) tokenizer decodes with byte-level BPE's alphabet."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    if type(decoder).__name__ == "ByteLevel":
        return True
    try:  # a Sequence decoder: look inside its serialized form
        return '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("decoder"))
    except Exception:  # an exotic backend: treat as not byte-level
        return False
