"""Teacher-forced forward passes over turns, in token-budget micro-batches.

A turn is the sequence ``prompt_ids + response_ids`` (``P`` + ``L`` tokens). Response token ``j``
is predicted at position ``P - 1 + j``; the value ``V_{k,j}`` is read at the same position, so
``j = 0..L`` spans the last prompt token to the last response token. Rows are right-padded: with
a causal mask real tokens never see the padding, and default position ids are right.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from verlog.algo import entropy_from_logits

__all__ = ["micro_batches", "pad_rows", "policy_logprobs", "positions", "values_at_positions", "last_token_values"]


def micro_batches(rows: Sequence[int], lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split ``rows`` into groups whose padded size (rows x longest sequence) fits ``token_budget``.

    Rows are sorted by length so each group pads little; a row longer than the budget is alone.
    """
    order = sorted(rows, key=lambda r: lengths[r])
    groups: list[list[int]] = []
    current: list[int] = []
    for row in order:
        if current and (len(current) + 1) * lengths[row] > token_budget:
            groups.append(current)
            current = []
        current.append(row)
    if current:
        groups.append(current)
    return groups


def pad_rows(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` for sequences of ids."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def positions(prompt_lengths: torch.Tensor, width: int, seq_len: int) -> torch.Tensor:
    """``[B, width]`` indices ``P - 1 + j`` (clamped into the sequence) for ``j = 0..width-1``."""
    j = torch.arange(width, device=prompt_lengths.device)
    return (prompt_lengths.unsqueeze(1) - 1 + j).clamp(max=seq_len - 1)


def policy_logprobs(
    lm: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_ids: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, T]`` of ``response_ids`` (``[B, T]``, padded) under ``lm``, and
    optionally the policy's entropy at the same positions.

    Only the response positions go through the LM head (``logits / temperature``, as sampled);
    ``temperature`` is one number or one per row (``[B]``: each turn at its own).
    """
    hidden = lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    width = response_ids.shape[1]
    index = positions(prompt_lengths.to(hidden.device), width, hidden.shape[1])
    picked = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    logits = lm.get_output_embeddings()(picked).float()
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.to(logits).view(-1, 1, 1)
    elif temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, response_ids.to(hidden.device).unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return logp, entropy


def values_at_positions(
    critic: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: torch.Tensor, width: int
) -> torch.Tensor:
    """The critic's values ``[B, width]`` at positions ``P - 1 + j`` (``width = T + 1``)."""
    values = critic(input_ids, attention_mask)
    index = positions(prompt_lengths.to(values.device), width, values.shape[1])
    return values.gather(1, index)


@torch.no_grad()
def last_token_values(
    critic: nn.Module, prompts: Sequence[Sequence[int]], pad_id: int, token_budget: int, device: torch.device | str
) -> torch.Tensor:
    """``V(s)`` of whole prompts (the value at each prompt's last token), ``[len(prompts)]``."""
    out = torch.zeros(len(prompts))
    lengths = [len(p) for p in prompts]
    for group in micro_batches(range(len(prompts)), lengths, token_budget):
        ids, mask = pad_rows([prompts[r] for r in group], pad_id, device)
        values = critic(ids, mask)
        last = torch.as_tensor([lengths[r] - 1 for r in group], device=values.device)
        out[group] = values.gather(1, last.unsqueeze(1)).squeeze(1).float().cpu()
    return out
