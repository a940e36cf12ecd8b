"""Teacher-forced forward passes over turns, in token-budget micro-batches.

A turn is the sequence ``prompt_ids + response_ids`` (``P`` + ``L`` tokens). Response token ``j``
is predicted at position ``P - 1 + j``; the value ``V_{k,j}`` is read at the same position, so
``j = 0..L`` spans the last prompt token to the last response token. Rows are right-padded: with
a causal mask real tokens never see the padding, and default position ids are right.

**Shared prefixes.** Game prompts repeat a long instruction every turn. When the rows of a
micro-batch share their first ``S`` tokens (and every position read lies after them), those
tokens run once: their keys and values (computed with gradients in a training pass) are
repeated over the rows, and only each row's rest goes through the model. Autograd sums the
rows' gradients into the one prefix computation, so logprobs, values and parameter gradients
equal the unshared pass up to float rounding.

The caches of a shared pass never change once written (``PrefixRecorder`` keeps the first keys and
values a layer computes and returns its input; ``FrozenPrefix`` returns the prefix followed by the
rows' own keys and values without storing them), so a layer recomputed during backward under
gradient checkpointing sees exactly what it saw in the forward pass. Hugging Face's checkpointed
layers drop any cache they are given; for the shared pass each checkpointed layer is instead run
through ``torch.utils.checkpoint`` (non-reentrant, which carries gradients to the cached prefix)
with its cache (``cache_safe_checkpointing``). A checkpointed shared pass therefore keeps only
each layer's inputs, like the unshared one.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.utils.checkpoint
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from verlog.algo import entropy_from_logits
from verlog.tokens import common_prefix_len

__all__ = [
    "PackedRows",
    "FrozenPrefix",
    "answer_logprobs",
    "Trunk",
    "PrefixRecorder",
    "backbone_hidden",
    "cache_safe_checkpointing",
    "last_token_values",
    "micro_batches",
    "pack_rows",
    "pad_rows",
    "pad_states",
    "policy_logprobs",
    "positions",
    "shared_trunk_depth",
    "trunk_states",
    "values_at_positions",
]


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


def pad_rows(
    seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` for sequences of ids."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


@dataclass
class PackedRows:
    """A micro-batch laid out for one forward pass: the rows' shared leading tokens
    (``prefix_ids``, ``[1, S]``, or ``None``) and the rest of each row (``input_ids``,
    right-padded, ``[B, W]``) with its ``attention_mask`` over prefix and rest (``[B, S + W]``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prefix_ids: torch.Tensor | None = None
    #: a vision-language model's pixel inputs of the one row's images (``pixel_values``...);
    #: such a row runs alone, whole (no shared prefix, no trunk)
    pixels: dict[str, torch.Tensor] | None = None
    #: with ``pixels``: how many leading tokens are the prompt the images belong to (the rest,
    #: the response, runs after the prompt's KV as the engine decoded it)
    pixels_prompt_len: int = 0

    @property
    def offset(self) -> int:
        """Sequence position of ``input_ids[:, 0]`` (the shared prefix's length)."""
        return 0 if self.prefix_ids is None else self.prefix_ids.shape[1]


def pack_rows(
    seqs: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device | str,
    *,
    first_read: Sequence[int] | torch.Tensor | None = None,
    min_shared: int = 0,
) -> PackedRows:
    """Lay out ``seqs`` for one pass, their common leading tokens apart when they share at least
    ``min_shared`` of them (0: never). ``first_read[i]``: the first position of row ``i`` whose
    output is read; the shared part ends before every row's, so every read position is computed
    per row."""
    shared = 0
    if min_shared > 0 and len(seqs) > 1 and first_read is not None:
        limit = min(int(x) for x in first_read)
        shared = common_prefix_len(seqs, max(0, limit))
        shared = shared if shared >= min_shared else 0
    if shared == 0:
        ids, mask = pad_rows(seqs, pad_id, device)
        return PackedRows(ids, mask)
    rest, rest_mask = pad_rows([s[shared:] for s in seqs], pad_id, device)
    mask = torch.cat([rest_mask.new_ones((len(seqs), shared)), rest_mask], dim=1)
    prefix = torch.as_tensor([list(seqs[0][:shared])], dtype=torch.long, device=rest.device)
    return PackedRows(rest, mask, prefix)


class PrefixRecorder(DynamicLayer):
    """One layer's cache for the prefix pass: keeps the first keys and values it is given and
    returns its input, so the pass (and any recomputation of it) attends to exactly its own tokens."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
        return key_states, value_states


class FrozenPrefix(DynamicLayer):
    """One layer's cache for the rows' pass: the prefix's keys and values (``[B, heads, S, d]``),
    returned followed by the rows' own at every call; nothing is stored, so a recomputed layer
    gets the same result."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def _checkpointed_layer_call(forward, *args, **kwargs):
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


@contextlib.contextmanager
def cache_safe_checkpointing(backbone: nn.Module) -> Iterator[None]:
    """While the block runs, layers that train with Hugging Face's gradient checkpointing (which
    would drop the cache) are checkpointed by ``torch.utils.checkpoint`` with their cache instead.
    The recomputation during backward calls the layer's own ``forward``, so it may run after the
    block has ended."""
    switched = [m for m in backbone.modules() if getattr(m, "gradient_checkpointing", False) is True and m.training]
    for module in switched:
        module.gradient_checkpointing = False  # the model itself would turn the cache off too
        if isinstance(module, GradientCheckpointingLayer):
            module.forward = functools.partial(_checkpointed_layer_call, module.forward)
    try:
        yield
    finally:
        for module in switched:
            vars(module).pop("forward", None)  # back to the class's method
            module.gradient_checkpointing = True


@contextlib.contextmanager
def _layers_only(backbone: nn.Module, part: slice, *, norm: bool) -> Iterator[None]:
    """While the block runs, ``backbone`` holds only its blocks ``part`` (and, unless ``norm``, no
    final norm): its forward then runs those blocks alone. The blocks are the same modules."""
    layers, final_norm = backbone.layers, backbone.norm
    backbone.layers = nn.ModuleList(list(layers)[part])
    if not norm:
        backbone.norm = nn.Identity()
    try:
        yield
    finally:
        backbone.layers, backbone.norm = layers, final_norm


@torch.no_grad()
def trunk_states(
    backbone: nn.Module,
    seqs: Sequence[Sequence[int]],
    depth: int,
    pad_id: int,
    device: torch.device | str,
    token_budget: int,
    *,
    min_shared: int = 0,
) -> list[torch.Tensor]:
    """The output ``[len_i, H]`` of the first ``depth`` blocks of ``backbone`` for each sequence
    (the frozen trunk, computed once for every pass that starts above it: see :class:`Trunk`).
    The leading tokens the sequences of a micro-batch share (at least ``min_shared`` of them; 0:
    never) run once for all of them, as in the passes above the trunk without one."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
    lengths = [len(x) for x in seqs]
    # the budget counts what the sequences all share once (it runs once per micro-batch)
    common = common_prefix_len(seqs, min(lengths) - 1) if min_shared > 0 and len(seqs) > 1 else 0
    common = common if common >= min_shared else 0
    budget_rows = micro_batches(range(len(seqs)), [n - common for n in lengths], max(1, token_budget - common))
    with _layers_only(backbone, slice(0, depth), norm=False):
        for group in budget_rows:
            # every row keeps one token of its own after the shared part
            rows = pack_rows(
                [seqs[r] for r in group],
                pad_id,
                device,
                first_read=[lengths[r] - 1 for r in group],
                min_shared=min_shared,
            )
            if rows.prefix_ids is None:
                hidden = backbone(
                    input_ids=rows.input_ids, attention_mask=rows.attention_mask, use_cache=False
                ).last_hidden_state
                for i, r in enumerate(group):
                    out[r] = hidden[i, : lengths[r]]
                continue
            prefix, hidden = _prefix_then_rows(backbone, rows)
            for i, r in enumerate(group):
                out[r] = torch.cat([prefix[0], hidden[i, : lengths[r] - rows.offset]])
    return out


@dataclass
class Trunk:
    """The frozen lower blocks the actor and the critic share (both train only blocks above
    ``depth``, and their blocks below are the same weights): their output for a batch's turns is
    computed once (``trunk_states``) and every pass of either model starts from it. ``states``:
    the rows of one pass, right-padded ``[B, W, H]``."""

    depth: int
    states: torch.Tensor


@torch.no_grad()
def shared_trunk_depth(actor_backbone: nn.Module, critic_backbone: nn.Module | None, depth: int) -> int | None:
    """``depth`` if the blocks below it (and the embeddings) may be computed once for both models:
    they are frozen and hold the same weights in both, and a pass split there gives the unsplit
    pass's output (a probe checks the architecture allows it); ``None`` otherwise."""
    if depth < 1:
        return None
    frozen = [actor_backbone.embed_tokens, *list(actor_backbone.layers)[:depth]]
    if any(p.requires_grad for m in frozen for p in m.parameters()):
        return None
    if critic_backbone is not None:
        theirs = [critic_backbone.embed_tokens, *list(critic_backbone.layers)[:depth]]
        for mine, other in zip(frozen, theirs):
            pairs = list(zip(mine.parameters(), other.parameters()))
            if len(pairs) != len(list(other.parameters())) or any(
                other_p.requires_grad or not torch.equal(p, other_p) for p, other_p in pairs
            ):
                return None
    device = next(actor_backbone.parameters()).device
    probe = torch.arange(1, 9, device=device).unsqueeze(0)
    mask = torch.ones_like(probe)
    whole = actor_backbone(input_ids=probe, attention_mask=mask, use_cache=False).last_hidden_state
    states = pad_states(trunk_states(actor_backbone, [probe[0].tolist()], depth, 0, device, 64))
    split = backbone_hidden(actor_backbone, PackedRows(probe, mask), Trunk(depth, states))
    return depth if torch.allclose(whole, split, atol=1e-4, rtol=1e-4) else None


def pad_states(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-row trunk outputs ``[len_i, H]`` right-padded (zeros) into ``[B, W, H]``."""
    return nn.utils.rnn.pad_sequence(list(states), batch_first=True)


def backbone_hidden(backbone: nn.Module, rows: PackedRows, trunk: Trunk | None = None) -> torch.Tensor:
    """Last hidden states ``[B, W, H]`` of a transformer backbone at positions ``offset ..``
    (with ``trunk``: the blocks above it run on its states; ``rows`` then share no prefix)."""
    if rows.pixels is not None:
        if trunk is not None or rows.prefix_ids is not None:
            raise ValueError("a row with images runs whole, from its ids and pixels (no trunk, no shared prefix)")
        return _prompt_with_images_then_rest(backbone, rows)
    if trunk is not None:
        if rows.prefix_ids is not None:
            raise ValueError("a pass from the trunk's states runs whole rows (no shared prefix)")
        with _layers_only(backbone, slice(trunk.depth, None), norm=True):
            return backbone(
                inputs_embeds=trunk.states, attention_mask=rows.attention_mask, use_cache=False
            ).last_hidden_state
    if rows.prefix_ids is None:
        return backbone(input_ids=rows.input_ids, attention_mask=rows.attention_mask, use_cache=False).last_hidden_state
    return _prefix_then_rows(backbone, rows)[1]


def _prompt_with_images_then_rest(backbone: nn.Module, rows: PackedRows) -> torch.Tensor:
    """One row with images: its prompt with the pixel inputs, then the rest of the row after the
    prompt's keys and values, as the engine decoded it. (The rest's ids are plain tokens even
    where one is an image placeholder the model happened to generate: only the prompt's
    placeholders take the pictures.)"""
    assert rows.pixels is not None and rows.input_ids.shape[0] == 1
    cut = rows.pixels_prompt_len or rows.input_ids.shape[1]
    ids = rows.input_ids
    with cache_safe_checkpointing(backbone):
        cache = Cache(layer_class_to_replicate=DynamicLayer)
        prompt = backbone(
            input_ids=ids[:, :cut],
            attention_mask=rows.attention_mask[:, :cut],
            past_key_values=cache,
            use_cache=True,
            **rows.pixels,
        ).last_hidden_state
        if cut == ids.shape[1]:
            return prompt
        rest = backbone(
            input_ids=ids[:, cut:],
            attention_mask=rows.attention_mask,
            position_ids=torch.arange(cut, ids.shape[1], device=ids.device)[None],
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
    return torch.cat([prompt, rest], dim=1)


def _prefix_then_rows(backbone: nn.Module, rows: PackedRows) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared prefix's pass once (``[1, S, H]``), then every row's own tokens attending to it
    (``[B, W, H]``, positions ``S ..``)."""
    batch, width = rows.input_ids.shape
    with cache_safe_checkpointing(backbone):
        recorded = Cache(layer_class_to_replicate=PrefixRecorder)
        prefix = backbone(input_ids=rows.prefix_ids, past_key_values=recorded, use_cache=True).last_hidden_state
        # expand, not copy: gradients of every row sum back into the one prefix computation
        frozen = Cache(
            layers=[
                FrozenPrefix(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1))
                for layer in recorded.layers
            ]
        )
        position_ids = (rows.offset + torch.arange(width, device=rows.input_ids.device)).expand(batch, -1)
        return prefix, backbone(
            input_ids=rows.input_ids,
            attention_mask=rows.attention_mask,
            position_ids=position_ids,
            past_key_values=frozen,
            use_cache=True,
        ).last_hidden_state


def positions(prompt_lengths: torch.Tensor, width: int, seq_len: int) -> torch.Tensor:
    """``[B, width]`` indices ``P - 1 + j`` (clamped into the sequence) for ``j = 0..width-1``."""
    j = torch.arange(width, device=prompt_lengths.device)
    return (prompt_lengths.unsqueeze(1) - 1 + j).clamp(max=seq_len - 1)


def policy_logprobs(
    lm: nn.Module,
    rows: PackedRows,
    prompt_lengths: torch.Tensor,
    response_ids: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    with_entropy: bool = False,
    trunk: Trunk | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, T]`` of ``response_ids`` (``[B, T]``, padded) under ``lm``, and
    optionally the policy's entropy at the same positions.

    Only the response positions go through the LM head (``logits / temperature``, as sampled);
    ``temperature`` is one number or one per row (``[B]``: each turn at its own). ``allowed``
    (``[B, T, V]`` bool): the tokens a grammar allowed at each position; the others' logits are
    ``-inf``, so logprobs and entropy are those of the masked distribution the engine sampled from.
    """
    hidden = backbone_hidden(lm.base_model, rows, trunk)
    width = response_ids.shape[1]
    index = positions(prompt_lengths.to(hidden.device) - rows.offset, width, hidden.shape[1])
    logp, entropy, _ = _head(lm, hidden, index, response_ids, temperature, allowed, with_entropy=with_entropy)
    return logp, (entropy if with_entropy else None)


def answer_logprobs(
    lm: nn.Module, rows: PackedRows, read_at: torch.Tensor, targets: torch.Tensor, *, trunk: Trunk | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities ``[B, M]`` of the tokens ``targets`` (``[B, M]``, padded), token ``m`` of
    row ``b`` predicted by the hidden state at sequence position ``read_at[b, m]`` (its own position
    minus one), and whether each is the model's most likely token there (``[B, M]`` bool): a pass
    scoring answers spread over a sequence (supervised fine-tuning: several turns of an episode in
    the one sequence of its last turn)."""
    hidden = backbone_hidden(lm.base_model, rows, trunk)
    index = (read_at.to(hidden.device) - rows.offset).clamp(min=0, max=hidden.shape[1] - 1)
    logp, _, hits = _head(lm, hidden, index, targets, 1.0, None, with_entropy=False, with_hits=True)
    return logp, hits


def _head(
    lm: nn.Module,
    hidden: torch.Tensor,
    index: torch.Tensor,
    targets: torch.Tensor,
    temperature: float | torch.Tensor,
    allowed: torch.Tensor | None,
    *,
    with_entropy: bool,
    with_hits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The LM head at the hidden states ``index`` (``[B, T]`` positions): each target's logprob,
    the entropy there (a zero without ``with_entropy``), and whether the target is the argmax."""
    picked = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    targets = targets.to(hidden.device)

    def head(picked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = lm.get_output_embeddings()(picked).float()
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        if isinstance(temperature, torch.Tensor):
            logits = logits / temperature.to(logits).view(-1, 1, 1)
        elif temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = entropy_from_logits(logits) if with_entropy else logp.new_zeros(())
        hits = logits.argmax(-1) == targets if with_hits else logp.new_zeros((), dtype=torch.bool)
        return logp, entropy, hits

    if torch.is_grad_enabled() and getattr(lm, "is_gradient_checkpointing", False):
        # the vocabulary-wide logits are the pass's largest activations (a [B, T, V] tensor per
        # softmax): with gradient checkpointing they are recomputed in backward, not kept
        logp, entropy, hits = torch.utils.checkpoint.checkpoint(head, picked, use_reentrant=False)
    else:
        logp, entropy, hits = head(picked)
    return logp, entropy, (hits if with_hits else None)


def values_at_positions(
    critic: nn.Module, rows: PackedRows, prompt_lengths: torch.Tensor, width: int, trunk: Trunk | None = None
) -> torch.Tensor:
    """The critic's values ``[B, width]`` at positions ``P - 1 + j`` (``width = T + 1``)."""
    values = critic.values(backbone_hidden(critic.backbone, rows, trunk))
    index = positions(prompt_lengths.to(values.device) - rows.offset, width, values.shape[1])
    return values.gather(1, index)


@torch.no_grad()
def last_token_values(
    critic: nn.Module,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    token_budget: int,
    device: torch.device | str,
    min_shared: int = 0,
    pixels: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> torch.Tensor:
    """``V(s)`` of whole prompts (the value at each prompt's last token), ``[len(prompts)]``;
    ``pixels[i]``: prompt ``i``'s image inputs (a vision-language model's; such prompts run alone)."""
    out = torch.zeros(len(prompts))
    lengths = [len(p) for p in prompts]
    with_images = [i for i in range(len(prompts)) if pixels is not None and pixels[i] is not None]
    for i in with_images:
        assert pixels is not None
        ids, mask = pad_rows([prompts[i]], pad_id, device)
        rows = PackedRows(
            ids, mask, pixels={k: v.to(ids.device) for k, v in pixels[i].items()}, pixels_prompt_len=lengths[i]
        )
        out[i] = critic.values(backbone_hidden(critic.backbone, rows))[0, lengths[i] - 1].float().cpu()
    plain = [i for i in range(len(prompts)) if i not in set(with_images)]
    for part in micro_batches(plain, lengths, token_budget):
        group = list(part)
        last = [lengths[r] - 1 for r in group]
        rows = pack_rows([prompts[r] for r in group], pad_id, device, first_read=last, min_shared=min_shared)
        values = critic.values(backbone_hidden(critic.backbone, rows))
        index = torch.as_tensor(last, device=values.device) - rows.offset
        out[group] = values.gather(1, index.unsqueeze(1)).squeeze(1).float().cpu()
    return out
