"""Stop strings matched on the device: one table lookup per row and decode step.

A stop string ends a response after the token that completes it, wherever the string starts
(possibly several tokens back, possibly inside a token). The response's text is the
concatenation of its tokens' bytes (:class:`~verlog.backends.token_bytes.TokenBytes`), so the
question "does the text now contain the stop string?" is answered by an automaton over bytes
(Knuth-Morris-Pratt's: state ``q`` = how many leading bytes of the string the text currently
ends with). Feeding a whole token's bytes to it from each state is precomputed for the whole
vocabulary, once per stop string:

    next[q, token] = the state after the token's bytes, or ``m`` (matched, absorbing)

so a decode step advances every row's automata with one gather, ``state = next[state, token]``,
on the device, and a row ends when one of its automata reaches its matched state. All stop
strings in use share one table (each automaton a block of rows; one extra absorbing row, the
*idle* state, pads rows with fewer strings), so any mix of requests decodes together.

Equivalent to decoding the response after every token and searching the stop strings in it
(``verlog.backends.base.ends_with_stop``, which engines without a table use).
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
import torch

from verlog.backends.token_bytes import TokenBytes

__all__ = ["DEFAULT_TABLE_BYTES", "StopStrings", "byte_automaton"]

#: the stop-string table's default size: about 680 automaton states on a 49k vocabulary (int16)
DEFAULT_TABLE_BYTES = 64 * 2**20


def byte_automaton(stop: bytes) -> np.ndarray:
    """KMP's transition table over bytes for ``stop`` (``m`` bytes): ``[m + 1, 257]``, where
    column 256 is "no byte" (the state stays) and state ``m`` (matched) is absorbing."""
    m = len(stop)
    fail = [0] * m  # fail[i]: the longest proper border of stop[:i + 1]
    k = 0
    for i in range(1, m):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        if stop[i] == stop[k]:
            k += 1
        fail[i] = k
    delta = np.zeros((m + 1, 257), dtype=np.int32)
    for q in range(m):
        for byte in range(256):
            if byte == stop[q]:
                delta[q, byte] = q + 1
            elif q:
                delta[q, byte] = delta[fail[q - 1], byte]
    delta[:, 256] = np.arange(m + 1)
    delta[m, :] = m
    return delta


def _token_transitions(delta: np.ndarray, vocab: Sequence[bytes]) -> np.ndarray:
    """``[m + 1, V]``: the state after each token's bytes, from each state (vectorized over the
    vocabulary, one byte position at a time, longest tokens first)."""
    lengths = np.fromiter((len(b) for b in vocab), dtype=np.int64, count=len(vocab))
    order = np.argsort(-lengths, kind="stable")
    longest = int(lengths.max()) if len(vocab) else 0
    padded = np.full((len(vocab), max(longest, 1)), 256, dtype=np.int32)
    for row, token in enumerate(vocab):
        if token:
            padded[row, : len(token)] = np.frombuffer(token, dtype=np.uint8)
    padded, sorted_lengths = padded[order], lengths[order]
    states = np.repeat(np.arange(delta.shape[0], dtype=np.int32)[:, None], len(vocab), axis=1)
    for pos in range(longest):
        live = int(np.searchsorted(-sorted_lengths, -pos, side="left"))  # the tokens longer than pos
        states[:, :live] = delta[states[:, :live], padded[None, :live, pos]]
    out = np.empty_like(states)
    out[:, order] = states
    return out


class StopStrings:
    """The stop strings of one engine's requests, as one device table of token transitions.

    ``start_states(stops)`` gives a request's start states (one per stop string), adding the
    strings' automata to the table; ``advance(states, tokens)`` moves every row's automata past
    the tokens just chosen and says which rows matched. The table only grows (graphs use a few
    stop strings, over and over); a request whose strings no longer fit in ``table_bytes`` gets
    ``None`` and its engine checks its stops on the host instead.

    Thread-safe: strings are added from callers' threads while the engine's worker reads the table.

    Args:
        tokenizer: the model's tokenizer (tokens' bytes).
        vocab_size: the width of the model's logits.
        device: where the table lives (the model's device).
        table_bytes: the most bytes the table may take.
    """

    def __init__(
        self, tokenizer: object, vocab_size: int, device: torch.device, table_bytes: int = DEFAULT_TABLE_BYTES
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.device = device
        self.max_states = max(1, min(table_bytes // (2 * vocab_size), 2**15 - 1))
        self._lock = threading.Lock()
        self._vocab: list[bytes] | None = None
        self._starts: dict[bytes, int] = {}  # string -> its automaton's first state
        self._states = 1  # state 0: idle (absorbing, never matched)
        self.matched = torch.zeros(1, dtype=torch.bool, device=device)
        self.table = torch.zeros((1, vocab_size), dtype=torch.int16, device=device)

    #: the padding state: never moves, never matches
    idle = 0

    def known(self, stops: Sequence[str]) -> list[int] | None:
        """The start states of ``stops`` if every one is in the table already (no work), else ``None``."""
        starts = [self._starts.get(s.encode("utf-8")) for s in stops]
        return None if None in starts else starts  # type: ignore[return-value]

    def start_states(self, stops: Sequence[str]) -> list[int] | None:
        """One start state per stop string, their automata added to the table if new (about 0.1 s
        per string on a 49k vocabulary, more the first time); ``None`` when they do not fit."""
        encoded = [s.encode("utf-8") for s in stops]
        if any(not s for s in encoded):
            raise ValueError("a stop string is empty")
        with self._lock:
            new = [s for s in dict.fromkeys(encoded) if s not in self._starts]
            if sum(len(s) + 1 for s in new) + self._states > self.max_states:
                return None
            if new:
                self._add(new)
            return [self._starts[s] for s in encoded]

    def _add(self, strings: list[bytes]) -> None:
        if self._vocab is None:
            self._vocab = TokenBytes(self.tokenizer).vocabulary(self.vocab_size)
        blocks, matched = [], []
        for s in strings:
            first = self._states
            moves = _token_transitions(byte_automaton(s), self._vocab) + first
            blocks.append(moves)
            matched += [False] * len(s) + [True]  # each automaton's last state: the string was seen
            self._states += len(moves)
        rows = torch.from_numpy(np.concatenate(blocks).astype(np.int16)).to(self.device)
        # ``matched`` first: the worker may read the new table with the old flags never
        self.matched = torch.cat([self.matched, torch.tensor(matched, device=self.device)])
        self.table = torch.cat([self.table, rows])
        at = self._states - sum(len(b) for b in blocks)
        for s, moves in zip(strings, blocks):
            self._starts[s] = at
            at += len(moves)

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Move ``states`` (``[B, K]``, in place) past ``tokens`` (``[B]``); return ``[B]``: which
        rows' text now contains one of their stop strings."""
        moved = self.table[states, tokens[:, None].expand_as(states)]
        states.copy_(moved)
        return self.matched[states].any(dim=1)
