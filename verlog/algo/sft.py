"""The supervised warm start's maths: cross-entropy on the answer tokens, Monte-Carlo returns.

``sft_loss`` is the negative log-likelihood of the demonstrated answer tokens, averaged over the
tokens of a (mini-)batch: ``L = -(1 / |A|) * sum_{t in A} log pi(a_t | s, a_<t)``, ``A`` the answer
tokens (the prompt, tool results and observations are context, never targets).

``monte_carlo_returns`` are a demonstration's discounted returns by turn,
``G_k = r_k + gamma_step * G_{k+1}`` (a demonstration is a whole episode): the value targets of a critic warmed on
demonstrations (with ``gamma_token = 1``, every position of turn ``k`` has target ``G_k``).
"""

from __future__ import annotations

from torch import Tensor

from verlog.algo.losses import masked_mean
from verlog.algo.multiturn_gae import discounted_reverse_cumsum

__all__ = ["monte_carlo_returns", "sft_loss"]


def sft_loss(logprobs: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """The token-mean negative log-likelihood of the answer tokens ``mask`` (``logprobs``: each
    target token's log-probability under the policy); metrics: ``sft_loss`` and its tokens."""
    loss = -masked_mean(logprobs, mask)
    return loss, {"sft_loss": float(loss.detach()), "answer_tokens": float(mask.sum())}


def monte_carlo_returns(rewards: Tensor, gamma: float) -> Tensor:
    """``G_k = r_k + gamma * G_{k+1}`` over the turns of one whole episode (``[K]``; the last
    turn ends it and bootstraps nothing)."""
    return discounted_reverse_cumsum(rewards.float(), gamma)
