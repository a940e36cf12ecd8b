"""A critic warmed on demonstrations (``sft.critic: monte_carlo``): the fine-tuned policy's backbone
with a value head, fitted to each demonstration turn's Monte-Carlo return.

Every value position ``j = 0..L_k`` of turn ``k`` (its last prompt token to its last answer token)
has the target ``G_k`` (with ``gamma_token = 1`` the returns within a turn are the turn's), the
loss the PPO value loss without its clip (``verlog.algo.clipped_value_loss``, the first position
weighted ``first_value_weight`` as in training). With ``critic.train_layers`` the frozen trunk the
critic shares with the policy runs once for all turns, as in the policy's fine-tuning.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch

from verlog.algo import clipped_value_loss
from verlog.config import VerlogConfig
from verlog.sft.collect import Demonstration
from verlog.sft.dataset import SftRow, value_rows
from verlog.train.forward import (
    PackedRows,
    Trunk,
    micro_batches,
    pad_rows,
    pad_states,
    shared_trunk_depth,
    trunk_states,
    values_at_positions,
)
from verlog.train.ppo import adamw
from verlog.weights.actor_critic import ValueModel, train_last_layers, trainable_parameters
from verlog.weights.precision import autocast

__all__ = ["fit_critic"]


def fit_critic(
    config: VerlogConfig,
    policy: Any,
    demos: Sequence[Demonstration],
    *,
    pad_id: int,
    device: torch.device,
    compute: torch.dtype | None,
    log: Callable[[dict[str, float]], None],
) -> ValueModel:
    """A critic made of a copy of ``policy`` (a causal LM; its adapters merged) fitted to the
    demonstrations' returns for ``sft.critic_epochs`` epochs of ``sft.batch_turns``-turn steps;
    ``log`` gets each epoch's figures."""
    assert config.sft is not None
    s, c = config.sft, config.critic
    critic = ValueModel.from_causal_lm(copy.deepcopy(policy))
    train_last_layers(critic, c.train_layers, section="critic")
    optimizer = adamw(critic, c)
    rows, targets = value_rows(demos, config.algorithm.gamma_step)
    trunk_depth = None
    if c.train_layers is not None:
        trunk_depth = shared_trunk_depth(critic.backbone, None, len(critic.backbone.layers) - c.train_layers)
    trunk: list[torch.Tensor] | None = None
    if trunk_depth is not None:
        with autocast(device, compute):
            trunk = trunk_states(
                critic.backbone,
                [r.ids for r in rows],
                trunk_depth,
                pad_id,
                device,
                config.algorithm.micro_batch_tokens,
                min_shared=config.algorithm.shared_prefix_min_tokens,
            )
    generator = torch.Generator()
    lengths = [len(r.ids) for r in rows]
    for epoch in range(s.critic_epochs):
        order = torch.randperm(len(rows), generator=generator.manual_seed(s.seed + 7919 * (epoch + 1))).tolist()
        steps = [order[i : i + s.batch_turns] for i in range(0, len(order), s.batch_turns)]
        sums: dict[str, float] = {}
        critic.train()
        for picked in steps:
            positions = sum(len(rows[r].answers) + 1 for r in picked)
            for group in micro_batches(picked, lengths, config.algorithm.micro_batch_tokens):
                metrics, share = _backward(
                    critic, rows, targets, group, positions, trunk, trunk_depth, config, pad_id, device, compute
                )
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * share / len(steps)
            torch.nn.utils.clip_grad_norm_(trainable_parameters(critic), c.max_grad_norm or float("inf"))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        critic.eval()
        log({**sums, "critic_epoch": float(epoch + 1)})
    return critic


def _backward(
    critic: ValueModel,
    rows: Sequence[SftRow],
    targets: Sequence[float],
    group: list[int],
    positions: int,
    trunk: list[torch.Tensor] | None,
    trunk_depth: int | None,
    config: VerlogConfig,
    pad_id: int,
    device: torch.device,
    compute: torch.dtype | None,
) -> tuple[dict[str, float], float]:
    """The value loss of the turns ``group`` (its share of the step's ``positions``), backward."""
    width = max(len(rows[r].answers) for r in group) + 1
    returns = torch.zeros(len(group), width)
    mask = torch.zeros(len(group), width, dtype=torch.bool)
    for i, r in enumerate(group):
        returns[i] = targets[r]
        mask[i, : len(rows[r].answers) + 1] = True
    ids, attention = pad_rows([rows[r].ids for r in group], pad_id, device)
    states = Trunk(trunk_depth, pad_states([trunk[r] for r in group]).to(device)) if trunk is not None else None
    prompt_lengths = torch.as_tensor([rows[r].prompt_len for r in group])
    with autocast(device, compute):
        values = values_at_positions(critic, PackedRows(ids, attention), prompt_lengths, width, states).float()
    returns, mask = returns.to(values.device), mask.to(values.device)
    loss, metrics = clipped_value_loss(
        values, values.detach(), returns, mask, clip=None, first_value_weight=config.algorithm.first_value_weight
    )
    share = float(mask.sum()) / positions
    (loss * share).backward()
    return {k: metrics[k] for k in ("value_loss", "explained_variance") if k in metrics}, share
