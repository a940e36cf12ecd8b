"""The PPO step of the embedded trainer: score a batch, then update actor and critic.

``score_batch`` fills a ``RolloutStorage`` with what the losses compare against (old logprobs,
values, KL-penalized rewards) and its advantages; ``ppo_update`` runs the epochs over shuffled
mini-batches, each a single optimizer step accumulated over token-budget micro-batches. The
losses themselves live in ``verlog.algo``.
"""

from __future__ import annotations

import base64
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from verlog.algo import aggregate, aggregation_weight, clipped_value_loss, kl_in_reward, masked_mean, policy_loss_fn
from verlog.algo.off_policy import OffPolicyCorrection, decoupled_advantages
from verlog.config import AlgorithmConfig
from verlog.tokens import common_prefix_len
from verlog.train.forward import (
    PackedRows,
    Trunk,
    last_token_values,
    micro_batches,
    pack_rows,
    pad_rows,
    pad_states,
    policy_logprobs,
    trunk_states,
    values_at_positions,
)
from verlog.train.grammar_masks import ResponseMasks, allowed_tokens
from verlog.train.storage import RolloutStorage
from verlog.weights.actor_critic import trainable_parameters
from verlog.weights.precision import autocast

__all__ = ["Learner", "adamw", "ppo_update", "score_batch"]


def adamw(model: torch.nn.Module, opts) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters (``opts`` has ``lr``, ``betas``, ``weight_decay``),
    fused (one kernel per tensor: no temporary copies of every parameter) where supported."""
    params = trainable_parameters(model)
    kwargs = {"lr": opts.lr, "betas": tuple(opts.betas), "weight_decay": opts.weight_decay}
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=False, **kwargs)


@dataclass
class Learner:
    """What an update touches: the models, their optimizers and the settings they are used with.

    ``autocast``: the compute dtype of every forward pass (``None``: float32), the weights staying
    float32 (:mod:`verlog.weights.precision`); ``actor_scaler`` / ``critic_scaler``: float16's loss
    scalers.
    """

    actor: nn.Module
    critic: nn.Module | None
    actor_optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer | None
    reference: nn.Module | None
    algo: AlgorithmConfig
    pad_id: int
    device: torch.device
    actor_max_grad_norm: float | None = None
    critic_max_grad_norm: float | None = None
    autocast: torch.dtype | None = None
    actor_scaler: torch.amp.GradScaler | None = None
    critic_scaler: torch.amp.GradScaler | None = None
    #: blocks below this one are frozen and the same in the actor and the critic: their output
    #: is computed once per batch and every pass starts above them (``None``: each pass runs
    #: every block; see ``shared_trunk_depth``)
    trunk_depth: int | None = None
    #: a vision-language model's pixel inputs of a prompt's images (``Turn.images``, base64
    #: files): ``PromptRenderer.image_inputs``; ``None``: a text model
    image_inputs: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None
    #: rebuilds constrained turns' token masks (``algorithm.constrained_logprobs: masked``);
    #: ``None``: constrained turns are scored under the model's whole distribution
    token_masks: ResponseMasks | None = None

    def compute(self):
        """The forward passes' precision context (``torch.autocast`` or nothing)."""
        return autocast(self.device, self.autocast)


def pixels_of(images: Sequence[str], learner: Learner) -> dict[str, torch.Tensor] | None:
    """The pixel inputs of a prompt's images (base64 files) on the learner's device (``None``: none)."""
    if not images:
        return None
    if learner.image_inputs is None:
        raise ValueError("a turn holds images, and the model being trained has no image processor")
    made = learner.image_inputs([base64.b64decode(x) for x in images])
    return {k: v.to(learner.device) for k, v in made.items()}


def _rows(s: RolloutStorage, group: list[int], learner: Learner, trunk: Trunk | None = None) -> PackedRows:
    """The turns ``group`` laid out for one pass, their shared leading tokens computed once
    (a pass from the ``trunk``'s states runs whole rows: the trunk is where sharing would save).
    A turn with images is a group of its own, run whole with its pixels."""
    if len(group) == 1 and s.row_images(group[0]):
        ids, mask = pad_rows([s.sequences[group[0]]], learner.pad_id, learner.device)
        return PackedRows(
            ids,
            mask,
            pixels=pixels_of(s.row_images(group[0]), learner),
            pixels_prompt_len=int(s.prompt_lengths[group[0]]),
        )
    share = 0 if trunk is not None else learner.algo.shared_prefix_min_tokens
    return pack_rows(
        [s.sequences[r] for r in group],
        learner.pad_id,
        learner.device,
        first_read=s.prompt_lengths[group] - 1,
        min_shared=share,
    )


def _trunk(s: RolloutStorage, group: list[int], learner: Learner) -> Trunk | None:
    """The trunk's states of the turns ``group``, for a pass that starts above it."""
    if learner.trunk_depth is None or s.trunk_states is None or any(s.row_images(r) for r in group):
        return None
    return Trunk(learner.trunk_depth, pad_states([s.trunk_states[r] for r in group]).to(learner.device))


def compute_trunk(s: RolloutStorage, learner: Learner) -> None:
    """Every turn's output of the shared frozen trunk (once per batch; kept in ``s``)."""
    if learner.trunk_depth is None or s.trunk_states is not None:
        return
    with learner.compute():
        states = trunk_states(
            learner.actor.base_model,
            s.sequences,
            learner.trunk_depth,
            learner.pad_id,
            learner.device,
            learner.algo.micro_batch_tokens,
            min_shared=learner.algo.shared_prefix_min_tokens,
        )
    s.trunk_states = [x.detach() for x in states]


def _micro_batches(s: RolloutStorage, rows: Sequence[int], learner: Learner) -> list[list[int]]:
    """``rows`` in groups that fit ``micro_batch_tokens``, counting the prefix every turn of the
    batch shares once (it is computed once per group; not with a shared trunk, whose passes run
    whole rows)."""
    algo, shared = learner.algo, 0
    if algo.shared_prefix_min_tokens and learner.trunk_depth is None:
        shared = common_prefix_len(s.sequences, int(s.prompt_lengths.min()) - 1)
        shared = shared if shared >= algo.shared_prefix_min_tokens else 0
    lengths = [len(seq) - shared for seq in s.sequences]
    alone = [[r] for r in rows if s.row_images(r)]  # a turn with images runs alone, with its pixels
    plain = [r for r in rows if not s.row_images(r)] if alone else rows
    return micro_batches(plain, lengths, max(1, algo.micro_batch_tokens - shared)) + alone


def _allowed(s: RolloutStorage, rows: list[int], learner: Learner) -> torch.Tensor | None:
    """The tokens the grammar allowed at each response position of ``rows`` (``[b, T, V]`` bool
    on the learner's device), ``None`` when none of them is a masked constrained turn."""
    if not s.token_masks or learner.token_masks is None:
        return None
    allowed = allowed_tokens(s.token_masks, rows, s.response_ids.shape[1], learner.token_masks.vocab_size)
    return None if allowed is None else allowed.to(learner.device)


def build_token_masks(s: RolloutStorage, learner: Learner) -> dict[str, float]:
    """Rebuild the token masks of the batch's constrained turns (once per batch); returns how
    many turns are scored under their masks and how many constrained turns could not be."""
    if learner.token_masks is None or not (s.constraints or s.unknown_grammars):
        return {}
    s.token_masks, unmasked = {}, s.unknown_grammars
    for row, constraint in enumerate(s.constraints):
        if constraint is None:
            continue
        n = int(s.response_mask[row].sum())
        packed = learner.token_masks.packed(constraint, s.response_ids[row, :n].tolist())
        if packed is None:
            unmasked += 1
        else:
            s.token_masks[row] = packed
    return {"masked_turns": float(len(s.token_masks)), "unmasked_constrained_turns": float(unmasked)}


@torch.no_grad()
def _policy_logprobs(lm: nn.Module, s: RolloutStorage, learner: Learner) -> torch.Tensor:
    """Teacher-forced logprobs ``[B, T]`` of every turn's response under ``lm``."""
    out = torch.zeros(s.response_ids.shape)
    for group in _micro_batches(s, range(s.size), learner):
        with learner.compute():
            trunk = _trunk(s, group, learner) if lm is learner.actor else None  # (not the reference's)
            logp, _ = policy_logprobs(
                lm,
                _rows(s, group, learner, trunk),
                s.prompt_lengths[group],
                s.response_ids[group],
                temperature=s.temperatures[group],
                trunk=trunk,
                allowed=_allowed(s, group, learner),
            )
        out[group] = logp.float().cpu()
    return out * s.response_mask


@torch.no_grad()
def compute_values(critic: nn.Module, s: RolloutStorage, learner: Learner) -> None:
    """The critic's values at every value position ``[B, T + 1]``, of each slot's held prompt, and
    of the state after each truncated turn whose next prompt is known (``NaN`` elsewhere); float32
    whatever the compute dtype."""
    with learner.compute():
        _compute_values(critic, s, learner)


def _compute_values(critic: nn.Module, s: RolloutStorage, learner: Learner) -> None:
    values = torch.zeros(s.size, s.response_ids.shape[1] + 1)
    for group in _micro_batches(s, range(s.size), learner):
        trunk = _trunk(s, group, learner) if critic is learner.critic else None
        values[group] = (
            values_at_positions(
                critic, _rows(s, group, learner, trunk), s.prompt_lengths[group], values.shape[1], trunk
            )
            .float()
            .cpu()
        )
    s.values = values * s.value_mask
    share = learner.algo.shared_prefix_min_tokens
    # a slot whose last turn ended its episode (or that gave no turn) holds no prompt: nothing bootstraps
    s.bootstrap_values = _prompt_values(critic, s.bootstrap_prompts, learner, share, 0.0, s.bootstrap_images)
    s.truncation_values = _prompt_values(critic, s.truncation_prompts, learner, share, float("nan"))


def _prompt_values(
    critic: nn.Module,
    prompts: Sequence[Sequence[int] | None],
    learner: Learner,
    share: int,
    missing: float,
    images: Sequence[tuple[str, ...]] = (),
) -> torch.Tensor:
    """The critic's value at the last token of each prompt, ``[len(prompts)]``; ``missing`` where
    there is no prompt (empty or ``None``)."""
    out = torch.full((len(prompts),), missing)
    known = [i for i, prompt in enumerate(prompts) if prompt]
    if known:
        out[known] = last_token_values(
            critic,
            [prompts[i] for i in known],
            learner.pad_id,
            learner.algo.micro_batch_tokens,
            learner.device,
            share,
            [pixels_of(images[i], learner) for i in known] if any(images) else None,
        )
    return out


def score_batch(
    s: RolloutStorage, learner: Learner, *, logprobs: bool = True, off_policy: OffPolicyCorrection | None = None
) -> dict[str, float]:
    """Old logprobs, values, KL-in-reward and advantages for a fresh batch; returns metrics.

    ``logprobs=False`` keeps the (KL-penalized) rewards and logprobs already computed: the
    critic warm-up rescores the same buffer, with an unchanged actor, after each critic pass.
    ``off_policy``: a batch with recorded turns (``s.turn_weights``) is corrected toward the
    behaviour policy that sampled them (decoupled PPO, ``verlog.algo.off_policy``): the old
    logprobs are then always the proximal policy's, recomputed.
    """
    algo, metrics = learner.algo, {}
    recorded = off_policy is not None and s.turn_weights is not None  # a batch with recorded turns
    tick = time.perf_counter()
    if learner.trunk_depth is not None and s.trunk_states is None:
        compute_trunk(s, learner)
        metrics["trunk_s"] = time.perf_counter() - tick
        tick = time.perf_counter()
    if s.token_masks is None:
        metrics |= build_token_masks(s, learner)
    if logprobs or s.old_logprobs is None:
        if algo.recompute_logprobs or recorded:
            s.old_logprobs = _policy_logprobs(learner.actor, s, learner)
            gap = (s.old_logprobs - s.rollout_logprobs).abs()
            metrics["rollout_logprob_gap"] = masked_mean(gap, s.response_mask).item()
        else:
            s.old_logprobs = s.rollout_logprobs
        s.token_rewards = s.env_token_rewards()
        if learner.reference is not None and algo.kl_coef > 0:
            ref_logprobs = _policy_logprobs(learner.reference, s, learner)
            s.token_rewards, kl = kl_in_reward(
                s.token_rewards, s.old_logprobs, ref_logprobs, s.response_mask, algo.kl_coef
            )
            metrics.update({f"ref_{k}": v for k, v in kl.items() if k != "kl_beta"})
    metrics["logprob_s"] = time.perf_counter() - tick
    if learner.critic is not None:
        tick = time.perf_counter()
        compute_values(learner.critic, s, learner)
        metrics["value_s"] = time.perf_counter() - tick
    metrics |= s.compute_advantages(algo)  # the estimator of verlog.algo.estimators' registry
    if recorded:  # decoupled PPO against the behaviour policy that sampled them
        s.policy_mask = s.policy_mask & (s.turn_weights > 0).unsqueeze(1)  # turns the staleness rule drops
        s.advantages, weights = decoupled_advantages(
            s.advantages, s.old_logprobs, s.rollout_logprobs, s.policy_mask, s.turn_weights, off_policy
        )
        metrics |= weights
    if s.returns is not None and s.values is not None:
        metrics["explained_variance"] = explained_variance(s.values, s.returns, s.value_mask)
    return metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the value positions (the critic's fit before the update)."""
    valid = mask.bool()
    r, v = returns[valid], values[valid]
    var = r.var(unbiased=False)
    return float("nan") if var <= 0 else float(1 - (r - v).var(unbiased=False) / var)


def ppo_update(
    s: RolloutStorage,
    learner: Learner,
    *,
    update_actor: bool = True,
    update_critic: bool = True,
    epochs: int | None = None,
    rows: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """PPO epochs over shuffled mini-batches of ``s`` (or of ``rows`` of it).

    ``update_actor=False`` trains the critic alone (critic warm-up); ``update_critic=False`` the
    actor alone. The two never read each other during the epochs, so the actor's and the critic's
    epochs may run apart (``verlog.train.update_process``): from the same ``generator`` state they
    draw the same mini-batches and take the same steps as together. Each mini-batch is one
    optimizer step; its loss is the token mean over the whole mini-batch, accumulated over
    micro-batches weighted by their share of its tokens.
    """
    critic = learner.critic if update_critic else None
    models = [m for m in (learner.actor if update_actor else None, critic) if m is not None]
    for model in models:
        model.train()  # dropout, gradient checkpointing
    try:
        return _epochs(s, learner, update_actor, update_critic, epochs, rows, generator)
    finally:
        for model in models:
            model.eval()  # the actor generates again right after


def _epochs(
    s: RolloutStorage,
    learner: Learner,
    update_actor: bool,
    update_critic: bool,
    epochs: int | None,
    rows: torch.Tensor | None,
    generator: torch.Generator | None,
) -> dict[str, float]:
    algo = learner.algo
    rows = torch.arange(s.size) if rows is None else rows
    train_critic = update_critic and learner.critic is not None and s.returns is not None
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)  # each model's passes and steps (and skipped steps), summed

    def record(values: dict[str, Any], weight: float) -> None:
        for key, value in values.items():
            sums[key] += float(value) * weight
            weights[key] += weight

    def stepped(model: str, norm: float) -> None:  # a skipped step (not finite) is counted, not averaged
        if math.isfinite(norm):
            record({f"{model}_grad_norm": norm}, 1.0)
        else:
            seconds[f"{model}_skipped_steps"] += 1

    for optimizer in (
        learner.actor_optimizer if update_actor else None,
        learner.critic_optimizer if train_critic else None,
    ):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
    for _ in range(epochs or algo.ppo_epochs):
        order = rows[torch.randperm(len(rows), generator=generator)]
        for start in range(0, len(order), algo.mini_batch_turns):
            mini = order[start : start + algo.mini_batch_turns].tolist()
            groups = _micro_batches(s, mini, learner)
            # one model at a time, so only one model's gradients exist at once
            # a mini-batch whose turns are all out of the policy loss (DAPO's dropped groups, ...)
            # does not step the actor: an optimizer step on zero gradients still moves the weights
            # (Adam's momentum, weight decay)
            policy_weight = aggregation_weight(s.policy_mask[mini], algo.loss_aggregation) if update_actor else 0.0
            if policy_weight > 0:
                tick = time.perf_counter()
                for micro in groups:
                    share = aggregation_weight(s.policy_mask[micro], algo.loss_aggregation) / policy_weight
                    record(_actor_step(s, micro, learner, share), share)
                norm = _step(learner.actor, learner.actor_optimizer, learner.actor_max_grad_norm, learner.actor_scaler)
                stepped("actor", norm)
                seconds["actor_s"] += time.perf_counter() - tick
            if train_critic:
                tick = time.perf_counter()
                tokens = s.value_mask[mini].sum().clamp(min=1)
                for micro in groups:
                    share = (s.value_mask[micro].sum() / tokens).item()
                    record(_critic_step(s, micro, learner, share), share)
                norm = _step(
                    learner.critic, learner.critic_optimizer, learner.critic_max_grad_norm, learner.critic_scaler
                )
                stepped("critic", norm)
                seconds["critic_s"] += time.perf_counter() - tick
    return {key: sums[key] / weights[key] for key in sums if weights[key] > 0} | dict(seconds)


def _actor_step(s: RolloutStorage, micro: list[int], learner: Learner, share: float) -> dict[str, float]:
    """Policy loss (clipped, dual-clip) minus the entropy bonus on one micro-batch; backward."""
    algo, dev = learner.algo, learner.device
    token_mask = s.policy_mask[micro].to(dev)
    with learner.compute():
        trunk = _trunk(s, micro, learner)
        logp, entropy = policy_logprobs(
            learner.actor,
            _rows(s, micro, learner, trunk),
            s.prompt_lengths[micro],
            s.response_ids[micro],
            temperature=s.temperatures[micro],
            with_entropy=algo.entropy_coef > 0,
            trunk=trunk,
            allowed=_allowed(s, micro, learner),
        )
    policy_loss, metrics = policy_loss_fn(algo.policy_loss)(
        logp,
        s.old_logprobs[micro].to(dev),
        s.advantages[micro].to(dev),
        token_mask,
        clip_eps=algo.clip_eps,
        dual_clip=algo.dual_clip,
        clip_eps_high=algo.clip_eps_high,
        aggregation=algo.loss_aggregation,
    )
    loss = policy_loss
    if entropy is not None:
        mean_entropy = aggregate(entropy, token_mask, algo.loss_aggregation)  # weighed as the policy loss
        loss = loss - algo.entropy_coef * mean_entropy
        metrics["entropy"] = mean_entropy.item()
    _backward(loss * share, learner.actor_scaler)
    return metrics


def _critic_step(s: RolloutStorage, micro: list[int], learner: Learner, share: float) -> dict[str, float]:
    """Clipped value loss on one micro-batch; backward."""
    algo, dev = learner.algo, learner.device
    width = s.values.shape[1]
    with learner.compute():
        trunk = _trunk(s, micro, learner)
        values = values_at_positions(
            learner.critic, _rows(s, micro, learner, trunk), s.prompt_lengths[micro], width, trunk
        )
    loss, metrics = clipped_value_loss(
        values,
        s.values[micro].to(dev),
        s.returns[micro].to(dev),
        s.value_mask[micro].to(dev),
        clip=algo.value_clip,
        first_value_weight=algo.first_value_weight,
    )
    metrics.pop("explained_variance", None)  # reported once per batch, before the update
    _backward(algo.value_loss_coef * loss * share, learner.critic_scaler)
    return metrics


def _backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    """Backward pass (on the float16 loss scaler's scaled loss when there is one)."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def _step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_norm: float | None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """Clip, step, and free the gradients (they would otherwise hold memory until the next pass).

    A step whose gradients are not finite (a NaN or an infinity anywhere) is skipped, so the
    weights never take one: the returned norm is then not finite (the metrics' grad norm shows
    it). With a loss scaler the gradients are unscaled before clipping and the scale comes down."""
    params = [p for p in model.parameters() if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf")) if params else torch.zeros(())
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    elif torch.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
