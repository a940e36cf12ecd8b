"""A prefix cache of KV tensors kept across engine calls: a radix tree over token ids.

Game prompts repeat a long instruction every turn, and chat prompts extend the previous turn's
prompt and answer. Keeping the keys and values computed for earlier prompts lets the next prefill
compute only the tokens that follow the longest cached prefix (SGLang's RadixAttention, vLLM's
automatic prefix caching). Each tree edge holds a span of token ids and their KV, for every layer
of the model, as one tensor ``[layers, 2 (key, value), kv_heads, tokens, head_dim]``; a path from
the root spells a prompt prefix, and its spans' KV concatenate to that prefix's KV.

The cache is bounded in bytes: inserting beyond the bound evicts the least recently used leaves.
It is only valid for the weights it was computed with: :meth:`PrefixCache.clear` drops everything
and moves :attr:`PrefixCache.epoch` on, so KV computed before (by a request still decoding) is not
inserted afterwards.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: ``kv_for(start, end)``: the KV of tokens ``start:end`` of the sequence being inserted
KVSource = Callable[[int, int], torch.Tensor]


@dataclass
class PrefixCacheStats:
    """What the cache did, for benchmarks and progress displays."""

    lookups: int = 0
    #: tokens served by lookups (not recomputed)
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    clears: int = 0


class _Node:
    """One edge of the tree: a span of token ids, their KV, and what follows them."""

    __slots__ = ("tokens", "kv", "children", "parent", "last_used")

    def __init__(self, tokens: tuple[int, ...], kv: torch.Tensor | None, parent: "_Node | None", tick: int):
        self.tokens = tokens
        self.kv = kv
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_used = tick

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """KV of token prefixes, bounded in bytes, least recently used leaves evicted first.

    Not thread-safe: the embedded engine uses it from its worker thread only (and clears it while
    holding the weights lock, when no batch runs).

    Args:
        capacity_bytes: the most bytes of KV kept (``0``: nothing is kept).
    """

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.bytes_used = 0
        self.tokens_held = 0
        #: moves on with every :meth:`clear`; KV computed under an older epoch is not inserted
        self.epoch = 0
        self.stats = PrefixCacheStats()
        self._ticks = itertools.count(1)
        self._root = _Node((), None, None, 0)

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __repr__(self) -> str:
        return (
            f"PrefixCache({self.tokens_held} tokens, {self.bytes_used / 2**20:.1f} of "
            f"{self.capacity_bytes / 2**20:.1f} MiB)"
        )

    # ------------------------------------------------------------------ lookup
    def match(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``tokens`` (at most ``limit`` tokens) and its KV.

        Returns ``(length, kv)`` with ``kv`` shaped ``[layers, 2, kv_heads, length, head_dim]``
        (``None`` when nothing matched). The spans it used become the most recently used.
        """
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        self.stats.lookups += 1
        if limit <= 0 or not self._root.children:
            return 0, None
        tick = next(self._ticks)
        parts: list[torch.Tensor] = []
        node, pos = self._root, 0
        while pos < limit:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            take = min(_common_len(child.tokens, tokens, pos), limit - pos)
            child.last_used = tick
            assert child.kv is not None
            parts.append(child.kv if take == len(child.tokens) else child.kv[:, :, :, :take])
            pos += take
            if take < len(child.tokens):
                break
            node = child
        if not parts:
            return 0, None
        self.stats.hit_tokens += pos
        return pos, parts[0] if len(parts) == 1 else torch.cat(parts, dim=3)

    def cached_len(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the cache holds (their KV is not read, nothing is marked
        used): the start of what :meth:`insert` would ask ``kv_for`` for."""
        return self._descend(tokens)[1]

    def _descend(self, tokens: Sequence[int], tick: int | None = None) -> tuple[_Node, int]:
        """Follow ``tokens`` down the tree: the node where their cached prefix ends and its length.
        With a ``tick`` (an insertion), the spans passed are marked used and a span the tokens
        leave midway is split there, so that the node returned ends exactly at that length."""
        node, pos, n = self._root, 0, len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            take = _common_len(child.tokens, tokens, pos)
            if tick is not None:
                child.last_used = tick
                if take < len(child.tokens):
                    child = self._split(child, take)  # (its first part, ``take`` tokens long)
            pos += take
            if take < len(child.tokens):
                break
            node = child
        return node, pos

    # ------------------------------------------------------------------ insertion
    def insert(self, tokens: Sequence[int], kv_for: KVSource, *, epoch: int | None = None) -> int:
        """Keep the KV of ``tokens``; ``kv_for(start, end)`` is asked only for the part not
        cached yet. Returns the number of tokens added (``0`` if the cache is off, or if ``epoch``
        is given and the cache was cleared since: that KV belongs to other weights)."""
        if not self.enabled or not tokens or (epoch is not None and epoch != self.epoch):
            return 0
        tick = next(self._ticks)
        node, pos = self._descend(tokens, tick)
        n = len(tokens)
        added = 0
        if pos < n:
            kv = kv_for(pos, n)
            if kv.shape[3] != n - pos:
                raise ValueError(f"kv_for({pos}, {n}) returned KV of {kv.shape[3]} tokens, expected {n - pos}")
            leaf = _Node(tuple(tokens[pos:]), kv, node, tick)
            node.children[leaf.tokens[0]] = leaf
            self.bytes_used += leaf.nbytes
            self.tokens_held += n - pos
            self.stats.inserted_tokens += n - pos
            added = n - pos
        if self.bytes_used > self.capacity_bytes:
            self._evict(self.bytes_used - self.capacity_bytes)
        return added

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut ``child``'s span at ``at``: a new node holds the first part, ``child`` the rest."""
        assert child.kv is not None and child.parent is not None and 0 < at < len(child.tokens)
        head = _Node(child.tokens[:at], child.kv[:, :, :, :at].clone(), child.parent, child.last_used)
        child.parent.children[head.tokens[0]] = head
        child.tokens = child.tokens[at:]
        child.kv = child.kv[:, :, :, at:].clone()  # copies: the old storage is freed, bytes stay exact
        child.parent = head
        head.children[child.tokens[0]] = child
        return head

    # ------------------------------------------------------------------ eviction
    def _evict(self, need: int) -> None:
        """Drop least recently used leaves until ``need`` bytes are freed."""
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(leaves)
        freed = 0
        while freed < need and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            freed += leaf.nbytes
            self.bytes_used -= leaf.nbytes
            self.tokens_held -= len(leaf.tokens)
            self.stats.evicted_tokens += len(leaf.tokens)
            leaf.kv = None
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def clear(self) -> None:
        """Drop every span (the model's weights changed) and move :attr:`epoch` on."""
        self._root = _Node((), None, None, 0)
        self.bytes_used = 0
        self.tokens_held = 0
        self.epoch += 1
        self.stats.clears += 1


def _common_len(span: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    """How many leading ids of ``span`` equal ``tokens[start:]``."""
    n = min(len(span), len(tokens) - start)
    if tuple(tokens[start : start + n]) == span[:n]:
        return n
    i = 0
    while i < n and span[i] == tokens[start + i]:
        i += 1
    return i
