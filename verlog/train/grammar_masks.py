"""The token masks that constrained turns were sampled under, rebuilt for training.

An engine that enforces a constraint (:mod:`verlog.backends.grammar`) draws each token from the
model's distribution with the tokens the grammar forbids set to ``-inf``: the policy that acted is
that masked distribution, ``pi_mask(a | s) = exp(z_a) / sum_{b allowed} exp(z_b)``. With
``algorithm.constrained_logprobs: masked`` (the default) every logprob the update computes for such
a turn (old, new, the reference's), and so PPO's ratio, the entropy bonus and the KL, is that
distribution's, as in policy gradients with invalid-action masking; the engine's own logprobs are
then the same numbers (a ratio of 1 on the first step even without ``recompute_logprobs``).
``policy`` scores the model's whole distribution instead: its ratios move with the mass of tokens
that could never be sampled (the sampled ones may hold almost none of it).

A turn records its grammar (``Turn.grammar``); its masks are rebuilt by replaying its response
through the same llguidance grammar, which is deterministic given the grammar and the tokens.
They are computed once per batch and kept packed as llguidance writes them (32 token ids per
int32 word). A turn whose masks cannot be rebuilt (a stored trace keeps no grammar; a token
outside the rebuilt mask: another engine's grammar backend, e.g. SGLang's default xgrammar, lays
JSON out its own way) is scored under the whole distribution and counted in the metrics.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from verlog.backends.base import Constraint, EngineError
from verlog.backends.decode_rows import unpack_bitmask
from verlog.backends.grammar import GrammarCompiler, fill_masks

__all__ = ["ResponseMasks", "allowed_tokens"]


class ResponseMasks:
    """Rebuilds, for one tokenizer, the masks each token of a constrained response was drawn under.

    Args:
        tokenizer: the model's (fast) Hugging Face tokenizer.
        vocab_size: the width of the model's logits.
        eos_token_ids: the ids that may end a response once its grammar is complete (the
            engine's: :func:`verlog.tokens.eos_token_ids`).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self._compiler = GrammarCompiler(tokenizer, vocab_size, tuple(eos_token_ids))

    def packed(self, constraint: Constraint, response_ids: Sequence[int]) -> torch.Tensor | None:
        """``[len(response_ids), words]`` int32: the tokens allowed before each response token,
        packed (bit ``j`` of word ``i`` is token ``32 i + j``); ``None`` when the response does not
        follow the grammar as this compiler reads it (a token it forbids), or the grammar is invalid."""
        try:
            matcher = self._compiler.matcher(constraint)
        except EngineError:  # an invalid grammar (InvalidConstraintError is one)
            return None
        rows = []
        for i, token in enumerate(response_ids):
            bitmask, errors = fill_masks([matcher])
            row = bitmask[0]
            inside = 0 <= token < 32 * len(row)  # (ids past the tokenizer's are never allowed)
            if errors[0] is not None or not inside or not (int(row[token // 32]) >> (token % 32)) & 1:
                return None
            rows.append(row)
            if i + 1 < len(response_ids):  # the last token needs no telling (an end token, or the limit)
                try:
                    matcher.accept(token)
                except EngineError:
                    return None
        return (
            torch.stack(rows) if rows else torch.zeros((0, (self._compiler.token_count + 31) // 32), dtype=torch.int32)
        )


def allowed_tokens(
    masks: dict[int, torch.Tensor], rows: Sequence[int], width: int, vocab_size: int
) -> torch.Tensor | None:
    """The allowed tokens ``[len(rows), width, vocab_size]`` (bool) of a micro-batch's turns
    (``rows`` of the batch; ``masks``: each constrained row's packed masks); every token at the
    positions of unconstrained turns and past a response's end. ``None`` when no row is constrained."""
    present = [(i, masks[row]) for i, row in enumerate(rows) if row in masks]
    if not present:
        return None
    out = torch.ones((len(rows), width, vocab_size), dtype=torch.bool)
    for i, packed in present:
        if len(packed):
            out[i, : len(packed)] = unpack_bitmask(packed, vocab_size)
    return out
