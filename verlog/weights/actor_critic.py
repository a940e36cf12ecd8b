"""The trainer's models: the actor (a causal LM, optionally with LoRA), the critic (a copy of the
actor's backbone with a scalar value head) and the frozen reference policy for KL-in-reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from verlog.config import ConfigError, LoRAConfig
from verlog.models import load_causal_lm as _load_causal_lm
from verlog.models.quiet import quiet_progress_bars

__all__ = [
    "ValueModel",
    "apply_lora",
    "load_actor",
    "load_critic",
    "load_reference",
    "pixel_inputs",
    "save_actor",
    "train_last_layers",
    "trainable_parameters",
]


class ValueModel(nn.Module):
    """The critic: an LM backbone (no LM head) and a linear value head: one value per position.

    ``forward(input_ids, attention_mask)`` returns ``[B, S]`` values; a turn's ``V(s_k)`` is the
    value at its last prompt token. The head starts at zero, so the first values are all 0.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_causal_lm(cls, lm: nn.Module) -> "ValueModel":
        """A critic initialised from a causal LM's weights (its backbone; the LM head is dropped)."""
        backbone = lm.base_model
        head_dtype = next(backbone.parameters()).dtype
        critic = cls(backbone, lm.config.get_text_config().hidden_size)  # (a vision model's: its text model's)
        critic.value_head.to(dtype=head_dtype, device=next(backbone.parameters()).device)
        return critic

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.values(hidden)

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values ``[B, S]`` from the backbone's last hidden states ``[B, S, H]``, in float32: the
        head runs outside any autocast (a bfloat16 value has 3 significant digits; returns and
        advantages are computed from these)."""
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def gradient_checkpointing_enable(self) -> None:
        self.backbone.gradient_checkpointing_enable()


def apply_lora(lm: nn.Module, lora: LoRAConfig) -> Any:
    """Wrap ``lm`` with LoRA adapters (peft). The adapters are injected into ``lm`` itself, so
    ``lm`` (shared with the inference engine) runs with them; the returned ``PeftModel`` is only
    needed to save and load the adapters."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("actor.lora.rank > 0 needs peft: pip install 'verlog[lora]'") from exc
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(lm, config)


def load_actor(path: str | Path, *, dtype: str, device: str, lora: LoRAConfig) -> tuple[nn.Module, Any]:
    """The actor LM from ``path`` and its ``PeftModel`` wrapper (``None`` without LoRA)."""
    lm = load_causal_lm(path, dtype=dtype, device=device)
    peft_model = apply_lora(lm, lora) if lora.rank > 0 else None
    if peft_model is not None:
        lm = peft_model.get_base_model()
    return lm, peft_model


def load_critic(path: str | Path, *, dtype: str, device: str) -> ValueModel:
    """The critic, initialised from the actor's starting weights at ``path``."""
    return ValueModel.from_causal_lm(load_causal_lm(path, dtype=dtype, device=device))


def load_reference(path: str | Path, *, dtype: str, device: str) -> nn.Module:
    """A frozen copy of the starting policy."""
    ref = load_causal_lm(path, dtype=dtype, device=device)
    ref.requires_grad_(False)
    return ref.eval()


def load_causal_lm(path: str | Path, *, dtype: str, device: str) -> nn.Module:
    """``verlog.models.load_causal_lm`` without transformers' loading progress bars."""
    with quiet_progress_bars():
        return _load_causal_lm(path, dtype=dtype, device=device)


def train_last_layers(model: nn.Module, layers: int | None, *, section: str) -> None:
    """Freeze all of ``model`` (a causal LM or a :class:`ValueModel`) but its last ``layers``
    transformer blocks, the backbone's final norm and a critic's value head (``None``: leave every
    parameter trainable). The frozen part keeps its starting weights; autograd then stops the
    backward pass at the first trainable block. ``section`` (``actor``/``critic``) names the key in
    errors."""
    if layers is None:
        return
    backbone = model.backbone if isinstance(model, ValueModel) else model.base_model
    blocks = getattr(backbone, "layers", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(
            f"{section}.train_layers needs a model whose backbone keeps its blocks in `.layers` "
            f"({type(backbone).__name__} does not): set {section}.train_layers: null"
        )
    if layers > len(blocks):
        raise ConfigError(f"{section}.train_layers: {layers} is more than the model's {len(blocks)} layers")
    model.requires_grad_(False)
    for module in (
        *blocks[len(blocks) - layers :],
        getattr(backbone, "norm", None),
        model.value_head if isinstance(model, ValueModel) else None,
    ):
        if module is not None:
            module.requires_grad_(True)


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def save_actor(folder: Path, actor: nn.Module, peft_actor: Any, tokenizer: Any, model_path: str) -> None:
    """A checkpoint's policy into ``folder``: the LoRA adapters (``actor_adapter/``) of
    ``peft_actor``, or the whole ``actor`` as a Hugging Face folder (``actor/``) with its tokenizer
    and, for a vision-language model, the processor settings of ``model_path`` (its images are then
    processed as in training wherever the checkpoint is served or evaluated)."""
    import shutil

    from verlog.models import resolve_model_path
    from verlog.models.safe_load import PROCESSOR_FILES
    from verlog.weights.checkpoint import ACTOR_FOLDER, ADAPTER_FOLDER

    with quiet_progress_bars():
        if peft_actor is not None:
            peft_actor.save_pretrained(folder / ADAPTER_FOLDER)
            return
        actor.save_pretrained(folder / ACTOR_FOLDER, safe_serialization=True)
        tokenizer.save_pretrained(folder / ACTOR_FOLDER)
    source = resolve_model_path(model_path)
    for name in PROCESSOR_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / ACTOR_FOLDER / name)


def pixel_inputs(model_path: str, tokenizer: Any) -> Any:
    """A vision-language model's pixel inputs of a turn's images (its processor's: base64 files ->
    tensors), ``None`` for a text model."""
    from verlog.llm.prompt import PromptRenderer
    from verlog.models import load_processor

    processor = load_processor(model_path, tokenizer)
    if processor is None:
        return None
    return PromptRenderer(tokenizer, processor=processor).image_inputs
