"""The embedded engine's decode step on the device: every running row's next token in a few
batched tensor ops.

:class:`DecodeRows` holds what choosing needs of each row of a batch, as tensors on the model's
device (its sampling settings, its random stream, how many tokens it has produced and may
produce, its stop token ids and stop-string automata, the tokens and logprobs chosen so far).
:meth:`DecodeRows.choose` then takes the batch's logits and, without a per-row Python loop or a
copy of any distribution to the host:

* computes ``log_softmax(logits / T)`` per row (``T = 1`` for greedy rows): the logprob recorded
  for the chosen token, the quantity a trainer recomputes;
* truncates to top-k / top-p where a row asks for it, and samples by inverse CDF with one
  uniform per row drawn from the row's own counter-based stream (:func:`uniforms`): a seeded
  request gets the same tokens whatever batch it runs in;
* appends the token and its logprob to the row's output buffer on the device;
* says which rows completed a stop token or a stop string (:mod:`verlog.backends.stop_strings`).

What leaves the device per step is one ``[B]`` vector of stop flags (the engine must know which
requests finished); lengths are counted on the host. A finished row's tokens and logprobs are
copied out once, when it ends. Grammar masks (constrained rows) arrive as llguidance's packed
bitmasks, one host-to-device copy per step, and are unpacked on the device (:func:`unpack_bitmask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from verlog.backends.stop_strings import StopStrings

__all__ = ["DecodeRows", "RowSpec", "filtered_probs", "seed_stream", "uniforms", "unpack_bitmask"]

# splitmix64's constants, as signed 64-bit integers (torch's int64 arithmetic wraps around)
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One uniform number in ``[0, 1)`` per row: splitmix64 of ``seed + (counter + 1) * golden``,
    top 24 bits (exact in float32). Row ``r``'s numbers depend only on ``seed[r]`` and
    ``counter[r]``, so a row's stream is its own whatever rows it is batched with."""
    z = seed + (counter + 1) * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * (1.0 / (1 << 24))


def seed_stream(seed: int) -> int:
    """A request's seed as the signed 64-bit integer its stream starts from."""
    seed %= 2**64
    return seed - 2**64 if seed >= 2**63 else seed


def filtered_probs(logprobs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Row-wise top-k (``-1`` = off) and top-p (nucleus) truncation of ``exp(logprobs)``,
    renormalized (rows asking for neither keep their whole distribution)."""
    probs = logprobs.exp()
    sorted_p, order = torch.sort(probs, dim=1, descending=True)
    rank = torch.arange(probs.shape[1], device=probs.device)[None, :]
    drop = (top_k[:, None] > 0) & (rank >= top_k[:, None])
    before = sorted_p.cumsum(1) - sorted_p  # the mass of the tokens ranked above this one
    drop |= before >= top_p[:, None]  # keep the smallest prefix reaching top_p
    probs = torch.zeros_like(probs).scatter_(1, order, sorted_p.masked_fill(drop, 0.0))
    return probs / probs.sum(dim=1, keepdim=True)


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """llguidance's packed masks (``[n, words]`` int32; bit ``j`` of word ``i`` = token
    ``32 i + j``) as booleans ``[n, width]`` (ids past the mask are not allowed)."""
    bits = (bitmask[:, :, None] >> torch.arange(32, device=bitmask.device, dtype=torch.int32)) & 1
    allowed = bits.reshape(len(bitmask), -1).bool()
    if allowed.shape[1] >= width:
        return allowed[:, :width]
    return torch.cat([allowed, allowed.new_zeros((len(bitmask), width - allowed.shape[1]))], dim=1)


@dataclass(frozen=True)
class RowSpec:
    """One request's settings as the decode step uses them."""

    temperature: float
    top_k: int
    top_p: float
    #: the start of the row's random stream (:func:`seed_stream`)
    seed: int
    #: the most tokens the row may produce (its ``max_new_tokens``, within the context)
    limit: int
    #: token ids that end the row (the request's and the model's end of sequence)
    stop_ids: tuple[int, ...]
    #: start states of its stop strings in the engine's :class:`StopStrings` table
    stop_states: tuple[int, ...] = ()


class DecodeRows:
    """The decode-time state of a batch's rows, on the model's device (row ``i`` = request ``i``).

    ``produced`` / ``limit`` are mirrored on the host (numpy) so that lengths, and the rows that
    reach their limit, are known without reading the device.
    """

    def __init__(self, specs: Sequence[RowSpec], device: torch.device):
        n = len(specs)
        as_t = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
        self.device = device
        temps = [s.temperature for s in specs]
        self.greedy = as_t([t <= 0 for t in temps], torch.bool)
        #: the temperature logprobs are taken at (1 for greedy rows)
        self.temperature = as_t([t if t > 0 else 1.0 for t in temps], torch.float32)
        self.top_k = as_t([s.top_k for s in specs], torch.long)
        self.top_p = as_t([s.top_p for s in specs], torch.float32)
        self.seed = as_t([s.seed for s in specs], torch.long)
        self.produced = torch.zeros(n, dtype=torch.long, device=device)
        self.produced_host = np.zeros(n, dtype=np.int64)
        self.limit_host = np.array([s.limit for s in specs], dtype=np.int64)
        self.stop_ids = _padded([s.stop_ids for s in specs], -1, device)
        self.stop_states = _padded([s.stop_states for s in specs], StopStrings.idle, device)
        #: per row, on the host: greedy, truncates (top-k / top-p), has stop strings
        self.kinds_host = np.array(
            [(s.temperature <= 0, s.top_k > 0 or s.top_p < 1, bool(s.stop_states)) for s in specs], dtype=bool
        ).reshape(n, 3)
        capacity = int(min(self.limit_host.max(initial=1), 64))
        self.out_ids = torch.zeros((n, capacity), dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros((n, capacity), dtype=torch.float32, device=device)
        self._flags()

    def _flags(self) -> None:
        """Which optional parts of the step this batch needs (host booleans, set on membership
        changes only)."""
        greedy, filtered, strings = self.kinds_host.T
        self.any_sampled = bool((~greedy).any())
        self.any_greedy = bool(greedy.any())
        self.any_filtered = bool(filtered.any())
        self.any_stop_strings = bool(strings.any())

    def __len__(self) -> int:
        return len(self.produced_host)

    # ------------------------------------------------------------------ membership
    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order)."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        for name in (
            "greedy",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "produced",
            "stop_ids",
            "stop_states",
            "out_ids",
            "out_logprobs",
        ):
            setattr(self, name, getattr(self, name)[idx])
        host = np.asarray(rows, dtype=np.int64)
        self.produced_host, self.limit_host = self.produced_host[host], self.limit_host[host]
        self.kinds_host = self.kinds_host[host]
        self._flags()

    def extend(self, other: "DecodeRows") -> None:
        """Append ``other``'s rows after these."""
        for name in ("greedy", "temperature", "top_k", "top_p", "seed", "produced"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.stop_ids = _cat_padded(self.stop_ids, other.stop_ids, -1)
        self.stop_states = _cat_padded(self.stop_states, other.stop_states, StopStrings.idle)
        self.out_ids = _cat_padded(self.out_ids, other.out_ids, 0)
        self.out_logprobs = _cat_padded(self.out_logprobs, other.out_logprobs, 0.0)
        self.produced_host = np.concatenate([self.produced_host, other.produced_host])
        self.limit_host = np.concatenate([self.limit_host, other.limit_host])
        self.kinds_host = np.concatenate([self.kinds_host, other.kinds_host])
        self._flags()

    # ------------------------------------------------------------------ the step
    def choose(
        self,
        logits: torch.Tensor,
        stops: StopStrings | None = None,
        allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Choose every row's next token from ``logits`` (``[B, V]``); append it to the row.

        ``allowed``: ``(rows, mask)``, the rows under a grammar and which tokens each may take
        (``[n, V]``). Returns ``(tokens, logprobs, stopped)``, each ``[B]`` on the device;
        ``stopped``: the token is a stop token id or completes a stop string.
        """
        logits = logits.float()
        if allowed is not None:
            rows, mask = allowed
            logits[rows] = logits[rows].masked_fill(~mask, float("-inf"))
        logprobs = torch.log_softmax(logits / self.temperature[:, None], dim=-1)
        choice = logprobs.argmax(dim=-1)
        if self.any_sampled:
            probs = filtered_probs(logprobs, self.top_k, self.top_p) if self.any_filtered else logprobs.exp()
            # inverse-CDF sampling, one uniform per row from its own stream: the first token whose
            # cumulative mass exceeds u (so never one of zero mass), u kept below the total
            cdf = probs.cumsum(dim=1)
            total = cdf[:, -1]
            u = torch.minimum(uniforms(self.seed, self.produced) * total, torch.nextafter(total, total.new_zeros(())))
            # (a row of NaN logits finds no token: its pick is clamped and its logprob is NaN)
            picks = torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp(max=logits.shape[1] - 1)
            choice = torch.where(self.greedy, choice, picks) if self.any_greedy else picks
        chosen_logprobs = logprobs.gather(1, choice[:, None])[:, 0]
        self._record(choice, chosen_logprobs)
        stopped = (self.stop_ids == choice[:, None]).any(dim=1)
        if self.any_stop_strings and stops is not None:
            stopped |= stops.advance(self.stop_states, choice)
        return choice, chosen_logprobs, stopped

    def _record(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        need = int(self.produced_host.max(initial=0)) + 1
        if need > self.out_ids.shape[1]:  # grow by doubling: amortized O(1) copies per token
            width = max(2 * self.out_ids.shape[1], need)
            self.out_ids = _cat_padded(self.out_ids, self.out_ids[:0].new_zeros((0, width)), 0)
            self.out_logprobs = _cat_padded(self.out_logprobs, self.out_logprobs[:0].new_zeros((0, width)), 0.0)
        at = self.produced[:, None]
        self.out_ids.scatter_(1, at, tokens[:, None])
        self.out_logprobs.scatter_(1, at, logprobs[:, None])
        self.produced += 1
        self.produced_host += 1

    def at_limit(self) -> np.ndarray:
        """Host booleans ``[B]``: the rows that have produced all they may."""
        return self.produced_host >= self.limit_host

    def outputs(self, rows: Sequence[int]) -> list[tuple[list[int], list[float]]]:
        """The tokens and logprobs of ``rows`` so far (one copy to the host)."""
        if not rows:
            return []
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        width = int(self.produced_host[list(rows)].max())
        ids = self.out_ids[idx, :width].tolist()
        logprobs = self.out_logprobs[idx, :width].tolist()
        lengths = self.produced_host[list(rows)].tolist()
        return [(i[:n], lp[:n]) for i, lp, n in zip(ids, logprobs, lengths)]


def _padded(rows: Sequence[Sequence[int]], fill: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device)


def _cat_padded(a: torch.Tensor, b: torch.Tensor, fill: float) -> torch.Tensor:
    """Stack the rows of two ``[n, w]`` tensors, the narrower padded on the right with ``fill``."""
    width = max(a.shape[1], b.shape[1])
    grow = lambda t: (
        t
        if t.shape[1] == width
        else torch.cat(  # noqa: E731
            [t, t.new_full((t.shape[0], width - t.shape[1]), fill)], dim=1
        )
    )
    return torch.cat([grow(a), grow(b)])
