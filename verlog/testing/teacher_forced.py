"""Logprobs recomputed the plainest way, to check recorded ones against: one forward pass of a
transformers causal LM over prompt + response, no cache, no batching, no padding."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["teacher_forced_logprobs"]


def teacher_forced_logprobs(
    model: Any,
    prompt_ids: list[int],
    response_ids: list[int],
    temperature: float = 1.0,
    pixels: dict[str, Any] | None = None,
) -> list[float]:
    """The logprob of each of ``response_ids`` after ``prompt_ids`` under ``model`` at
    ``temperature`` (a greedy turn, temperature 0, is scored at 1); ``pixels``: a vision-language
    model's image inputs for the prompt (``PromptRenderer.image_inputs``)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        if pixels is None:
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
        else:  # the prompt with its pictures, then the response after its KV (as it was decoded)
            n = len(prompt_ids)
            first = model(input_ids=ids[:, :n], use_cache=True, **pixels)
            rest = model(
                input_ids=ids[:, n:],
                position_ids=torch.arange(n, ids.shape[1])[None],
                past_key_values=first.past_key_values,
                use_cache=True,
            )
            logits = torch.cat([first.logits[0, -1:], rest.logits[0, :-1]])
        logits = logits.float() / (temperature or 1.0)
    picked = torch.tensor(list(response_ids)).unsqueeze(-1)
    return torch.log_softmax(logits, -1).gather(-1, picked).squeeze(-1).tolist()
