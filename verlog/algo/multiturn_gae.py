"""Advantages for multi-turn PPO: Verlog's dual-discount GAE, vectorized, and classic GAE.

The batch (``TurnBatch``) holds ``N`` environment slots x ``K`` consecutive turns of each slot,
in the spirit of a RolloutStorage: turn ``k + 1`` of a slot follows turn ``k`` in time, possibly
in a new episode when turn ``k`` was done. Each turn is one model call; its response has
``L_k`` tokens, right-padded to ``T``.

Notation (the paper's). ``V_{k,j}`` is the critic's value at the position just before response
token ``j`` of turn ``k``: ``V_{k,0} = V(s_k)`` is read at the last prompt token, ``V_{k,L_k}`` at
the last response token (the state after the whole response, before the environment answers).
So a turn has ``L_k + 1`` value positions ``j = 0..L_k`` and ``L_k`` tokens ``j = 0..L_k-1``.

Dual-discount GAE scans backwards over turns ``k`` and positions ``j``::

    entering turn k from turn k+1:  A <- (1 - d_k) * A
    j = L_k (the step bridge):      delta = gamma_step * V_next_k - V_{k,L_k}
                                    A_{k,L_k} = delta + gamma_step * lam_step * A_{k+1,0}
    j < L_k (tokens):               delta = r_{k,j} + gamma_tok * V_{k,j+1} - V_{k,j}
                                    A_{k,j} = delta + gamma_tok * lam_tok * A_{k,j+1}
    returns = A + V

``V_next_k`` is the value of the state after turn ``k``: ``V_{k+1,0}`` inside an episode, the
slot's bootstrap value for the last turn of the slot (the turn cut by the batch boundary),
``0`` when turn ``k`` terminated, and the truncated episode's next-state value (when known,
else ``0``) when a time limit cut it. The environment reward sits on the last response token
(``r_{k,L_k-1}``), so it enters through the token TD error of that token; the bridge position
has no token and no reward of its own. With ``gamma_tok = lam_tok = 1`` the bridge telescopes
away: ``A_{k,j} = sum_{i>=j} r_{k,i} + gamma_step * V_next_k - V_{k,j} + gamma_step * lam_step *
(1 - d_k) * A_{k+1,0}`` and ``V_{k,L_k}`` drops out.

Truncation is kept apart from termination (like ``bad_masks`` in pytorch-a2c-ppo-acktr-gail):
both end the episode, so the advantage never flows from the next turn of the slot (a new
episode) into a done turn, but a truncated turn still bootstraps its TD error from the value
of the state the time limit cut off, when the rollout could provide it.

How ``dual_gae`` avoids a Python loop over tokens: (1) every token TD error of every turn at
once; (2) per turn ``W_k = sum_i (gamma_tok lam_tok)^i delta_{k,i}``, so that ``A_{k,0} = W_k +
(gamma_tok lam_tok)^L_k A_{k,L_k}`` (one mat-vec); (3) the step recursion for the bridges
``A_{k,L_k}``, a loop over the ``K`` turns vectorized over slots; (4) one discounted reverse
cumulative sum of ``[delta_{k,0}, ..., delta_{k,L_k-1}, A_{k,L_k}]`` gives every ``A_{k,j}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["TurnBatch", "classic_gae", "discounted_reverse_cumsum", "dual_gae", "next_state_values"]


@dataclass
class TurnBatch:
    """``num_envs`` slots x ``turns_per_env`` consecutive turns, responses padded to ``T``.

    Shapes (``N`` slots, ``K`` turns per slot, ``T`` max response length):

    * ``token_rewards`` ``[N, K, T]``: reward of each response token; the environment's reward
      for the turn sits on its last response token (index ``L_k - 1``), token-level terms
      (e.g. the KL penalty of ``kl_in_reward``) anywhere. Padding is ignored.
    * ``response_mask`` ``[N, K, T]`` bool: ``True`` for response tokens ``j < L_k`` (a prefix).
    * ``terminated`` ``[N, K]`` bool: the task ended after this turn; nothing to bootstrap from.
    * ``truncated`` ``[N, K]`` bool: a time limit ended the episode after this turn; the next
      state still has a value (``truncation_values``). A turn both terminated and truncated
      counts as terminated.
    * ``values`` ``[N, K, T + 1]`` (GAE only): ``V_{k,j}`` for positions ``j = 0..L_k``; index
      ``0`` is read at the last prompt token, index ``L_k`` at the last response token.
    * ``bootstrap_values`` ``[N]`` (GAE only): value of each slot's next prompt (the call
      waiting at the batch boundary); used for the slot's last turn when it is not done.
    * ``truncation_values`` ``[N, K]`` optional: value of the state that followed a truncated
      turn (the prompt the model would have seen next); ``NaN`` where unknown. Where unknown,
      or when the field is ``None``, a truncated turn bootstraps from ``0`` like a terminal one.

    ``done = terminated | truncated`` ends an episode: the advantage recursion never crosses
    it, the next turn of the slot starts a new episode.
    """

    token_rewards: Tensor
    response_mask: Tensor
    terminated: Tensor
    truncated: Tensor
    values: Tensor | None = None
    bootstrap_values: Tensor | None = None
    truncation_values: Tensor | None = None

    def __post_init__(self) -> None:
        if self.token_rewards.dim() != 3:
            raise ValueError(f"token_rewards must be [N, K, T], got {tuple(self.token_rewards.shape)}")
        n, k, t = self.token_rewards.shape
        self.response_mask = self.response_mask.bool()
        self.terminated = self.terminated.bool()
        self.truncated = self.truncated.bool()
        _check_shape("response_mask", self.response_mask, (n, k, t))
        _check_shape("terminated", self.terminated, (n, k))
        _check_shape("truncated", self.truncated, (n, k))
        if t > 1 and bool((self.response_mask[..., 1:] & ~self.response_mask[..., :-1]).any()):
            raise ValueError("response_mask must be a prefix mask (right padding)")
        if self.values is not None:
            _check_shape("values", self.values, (n, k, t + 1))
        if self.bootstrap_values is not None:
            _check_shape("bootstrap_values", self.bootstrap_values, (n,))
        if self.truncation_values is not None:
            _check_shape("truncation_values", self.truncation_values, (n, k))

    @property
    def num_envs(self) -> int:
        return self.token_rewards.shape[0]

    @property
    def turns_per_env(self) -> int:
        return self.token_rewards.shape[1]

    @property
    def max_response_length(self) -> int:
        return self.token_rewards.shape[2]

    @property
    def lengths(self) -> Tensor:
        """``L_k`` per turn, ``[N, K]`` long."""
        return self.response_mask.sum(-1)

    @property
    def dones(self) -> Tensor:
        """``d_k = terminated | truncated``, ``[N, K]`` bool: the episode ended after turn ``k``."""
        return self.terminated | self.truncated

    @property
    def value_mask(self) -> Tensor:
        """``[N, K, T + 1]`` bool: the value positions ``j = 0..L_k`` of each turn."""
        positions = torch.arange(self.max_response_length + 1, device=self.response_mask.device)
        return positions <= self.lengths.unsqueeze(-1)


def _check_shape(name: str, x: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")


def next_state_values(
    first_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor | None,
    truncation_values: Tensor | None = None,
) -> Tensor:
    """``V_next_k``: the value of the state after turn ``k``, ``0`` where nothing bootstraps.

    ``first_values`` ``[N, K]`` holds each turn's ``V(s_k)``. Inside an episode the next state
    is the slot's next turn; for the slot's last turn it is the slot's ``bootstrap_values``
    (``[N]``, required when some last turn is not done); after a terminated turn it is ``0``;
    after a truncated one it is ``truncation_values`` where finite, else ``0``.
    """
    n, k = first_values.shape
    terminated, truncated = terminated.bool(), truncated.bool()
    if bootstrap_values is None:
        if k and not bool((terminated[:, -1] | truncated[:, -1]).all()):
            raise ValueError("bootstrap_values are needed: a slot's last turn is not done")
        bootstrap_values = first_values.new_zeros(n)
    following = torch.cat([first_values[:, 1:], bootstrap_values.to(first_values).unsqueeze(1)], dim=1)
    zero = first_values.new_zeros(())
    if truncation_values is not None:
        tv = truncation_values.to(first_values)
        after_truncation = torch.where(torch.isfinite(tv), tv, zero)
    else:
        after_truncation = first_values.new_zeros(n, k)
    v_next = torch.where(truncated, after_truncation, following)
    return torch.where(terminated, zero, v_next)


def discounted_reverse_cumsum(x: Tensor, discount: float, chunk_size: int = 64) -> Tensor:
    """``y_j = x_j + discount * y_{j+1}`` along the last dim, i.e. ``y_j = sum_{i>=j} discount^(i-j) x_i``.

    Computed without a Python loop over positions: a reverse ``cumsum`` when ``discount == 1``,
    otherwise a product with the ``C x C`` matrix ``M[i, j] = discount^(i-j)`` (``i >= j``) inside
    chunks of ``C = chunk_size`` positions, then one carry per chunk. Every power in it is at
    most 1, so nothing over- or underflows (unlike rescaling a plain cumsum by
    ``discount^-j``), and memory stays ``O(C^2)`` for long responses.
    """
    t = x.shape[-1]
    if t == 0:
        return x.clone()
    if discount == 1.0:
        return x.flip(-1).cumsum(-1).flip(-1)
    c = min(chunk_size, t)
    n_chunks = -(-t // c)
    chunks = F.pad(x, (0, n_chunks * c - t)).reshape(*x.shape[:-1], n_chunks, c)
    pos = torch.arange(c, device=x.device)
    gap = (pos.unsqueeze(1) - pos.unsqueeze(0)).to(x.dtype)  # gap[i, j] = i - j
    discount_matrix = torch.where(gap >= 0, discount ** gap.clamp(min=0), torch.zeros((), dtype=x.dtype))
    y = chunks @ discount_matrix  # y[..., m, j] = sum over i >= j inside chunk m
    carry = discount ** (c - pos).to(x.dtype)  # what chunk m+1's first sum is worth at position j
    for m in range(n_chunks - 2, -1, -1):
        y[..., m, :] += carry * y[..., m + 1, :1]
    return y.reshape(*x.shape[:-1], n_chunks * c)[..., :t]


@torch.no_grad()
def dual_gae(
    batch: TurnBatch,
    gamma_step: float = 0.99,
    lam_step: float = 0.95,
    gamma_token: float = 1.0,
    lam_token: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Verlog's dual-discount GAE over a ``TurnBatch`` (the recursion in the module docstring).

    Returns ``(advantages, returns)``:

    * ``advantages`` ``[N, K, T]``: ``A_{k,j}`` for response tokens ``j < L_k`` (what the policy
      loss uses with ``response_mask``), ``0`` on padding;
    * ``returns`` ``[N, K, T + 1]``: ``A_{k,j} + V_{k,j}`` for value positions ``j = 0..L_k``
      (the critic's targets, used with ``batch.value_mask``), ``0`` on padding.

    ``gamma_step``/``lam_step`` discount across turns, ``gamma_token``/``lam_token`` across the
    tokens of one response. Work is done in the dtype of ``batch.values``; the only Python loop
    is over the ``K`` turns of a slot.
    """
    if batch.values is None:
        raise ValueError("dual_gae needs batch.values")
    values = batch.values
    dtype, device = values.dtype, values.device
    zero = torch.zeros((), dtype=dtype, device=device)
    _, k_turns, t_max = batch.token_rewards.shape
    lengths = batch.lengths  # L_k
    positions = torch.arange(t_max + 1, device=device)  # j = 0..T
    token_mask = batch.response_mask  # j < L_k
    position_mask = positions <= lengths.unsqueeze(-1)  # j <= L_k
    decay_token = gamma_token * lam_token
    # Padding may hold anything (even NaN): it is only ever read through torch.where.

    # Tokens j < L_k: delta_{k,j} = r_{k,j} + gamma_tok * V_{k,j+1} - V_{k,j}  (0 from j = L_k on).
    td = batch.token_rewards.to(dtype) + gamma_token * values[..., 1:] - values[..., :-1]
    delta = F.pad(torch.where(token_mask, td, zero), (0, 1))  # [N, K, T + 1]

    # The step bridge at j = L_k: delta_k = gamma_step * V_next_k - V_{k,L_k}.
    v_last = values.gather(-1, lengths.unsqueeze(-1)).squeeze(-1)
    v_next = next_state_values(
        values[..., 0], batch.terminated, batch.truncated, batch.bootstrap_values, batch.truncation_values
    )
    delta_step = gamma_step * v_next - v_last
    not_done = (~batch.dones).to(dtype)

    # Inside turn k the token recursion unrolls to (g = gamma_tok * lam_tok)
    #     A_{k,j} = sum_{j <= i < L_k} g^(i-j) delta_{k,i} + g^(L_k-j) A_{k,L_k},
    # so A_{k,0} = W_k + g^L_k A_{k,L_k} with W_k = sum_i g^i delta_{k,i}.
    # That is all the step recursion needs: backwards over turns, A_{K,0} = 0 past the batch.
    decay_powers = decay_token ** positions.to(dtype)  # (gamma_tok lam_tok)^m, m = 0..T
    turn_sums = delta @ decay_powers  # W_k
    through_turn = decay_powers[lengths]  # (gamma_tok lam_tok)^L_k
    adv_bridge = torch.empty_like(v_last)  # A_{k,L_k}
    adv_next_first = torch.zeros_like(v_last[:, 0])  # A_{k+1,0}
    for k in reversed(range(k_turns)):
        adv_next_first = not_done[:, k] * adv_next_first  # entering turn k: A <- (1 - d_k) A
        adv_bridge[:, k] = delta_step[:, k] + gamma_step * lam_step * adv_next_first
        adv_next_first = turn_sums[:, k] + through_turn[:, k] * adv_bridge[:, k]

    # With A_{k,L_k} known, every turn's advantages are one discounted reverse cumsum of
    # [delta_{k,0}, ..., delta_{k,L_k-1}, A_{k,L_k}, 0, ...], for all turns at once.
    delta.scatter_(-1, lengths.unsqueeze(-1), adv_bridge.unsqueeze(-1))
    adv = discounted_reverse_cumsum(delta, decay_token)
    returns = torch.where(position_mask, adv + values, zero)
    advantages = torch.where(token_mask, adv[..., :-1], zero)
    return advantages, returns


@torch.no_grad()
def classic_gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor | None = None,
    bootstrap_values: Tensor | None = None,
    truncation_values: Tensor | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Plain GAE over steps, one step per turn: ``[N, K]`` rewards and values ``V(s_k)``.

    ``delta_k = r_k + gamma * V_next_k - V(s_k)``, ``A_k = delta_k + gamma * lam * (1 - d_k) * A_{k+1}``
    with ``V_next_k`` as in ``next_state_values`` (same done / truncation / boundary rules as
    ``dual_gae``). Returns ``(advantages, returns)``, both ``[N, K]``.
    """
    if truncated is None:
        truncated = torch.zeros_like(terminated, dtype=torch.bool)
    terminated, truncated = terminated.bool(), truncated.bool()
    rewards = rewards.to(values.dtype)
    v_next = next_state_values(values, terminated, truncated, bootstrap_values, truncation_values)
    not_done = (~(terminated | truncated)).to(values.dtype)
    delta = rewards + gamma * v_next - values
    advantages = torch.empty_like(values)
    adv_next = torch.zeros_like(values[:, 0])
    for k in reversed(range(values.shape[1])):
        adv_next = delta[:, k] + gamma * lam * not_done[:, k] * adv_next
        advantages[:, k] = adv_next
    return advantages, advantages + values
