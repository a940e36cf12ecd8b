"""The policy a checkpoint holds, found and loaded the same way for ``verlog serve-model`` and
``verlog eval``: the same weights, so the same answers.

A policy source is any of:

* a model spec, Hugging Face folder or hub id (``tiny``, ``smollm2``, a training checkpoint's
  ``actor/``, ``org/name`` in the local Hugging Face cache);
* a training run folder (its latest checkpoint) or a checkpoint folder (``update_NNNNNN``): its
  ``actor/``, or its LoRA ``actor_adapter/`` on the base model;
* a LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).

Adapters are merged into the base model's weights at load. The base is the one given (eval:
the config's ``model.path``; serve-model: ``--base-model``), else the one the adapters were
trained on (``base_model_name_or_path`` in ``adapter_config.json``). Everything read is checked
as untrusted input first (:mod:`verlog.models.safe_load`); a refusal is one
``CheckpointError`` line naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verlog.models import MODEL_SPECS, ModelNotFoundError, load_causal_lm, load_tokenizer, resolve_model_path
from verlog.models.safe_load import ADAPTER_CONFIG, CheckpointError, check_adapter_folder, merge_adapter
from verlog.weights.checkpoint import (
    ACTOR_FOLDER,
    ADAPTER_FOLDER,
    checkpoints_root,
    resolve_checkpoint,
    verify_checkpoint,
)

__all__ = ["PolicySource", "check_finite_weights", "find_policy", "full_model_path", "load_policy"]


@dataclass(frozen=True)
class PolicySource:
    """Where a policy's parts are: the full model's folder (the base, with adapters), the LoRA
    adapters (or ``None``), the tokenizer's folder, and the training checkpoint it came from."""

    model: Path
    adapter: Path | None
    tokenizer: Path
    checkpoint: Path | None = None

    @property
    def label(self) -> str:
        """What the source is called in messages: the checkpoint, the adapters or the model folder."""
        return str(self.checkpoint or self.adapter or self.model)

    @property
    def version(self) -> str:
        """The id of these weights as a served model version: ``RUN/update_NNNNNN`` for a training
        checkpoint, else the adapters' or the model's folder name (a model spec's name)."""
        if self.checkpoint is not None:
            return f"{self.checkpoint.parent.parent.name}/{self.checkpoint.name}"
        return (self.adapter or self.model).name


def _is_checkpoint_source(path: Path) -> bool:
    return os.path.lexists(path / "state.json") or os.path.lexists(checkpoints_root(path))


#: what a training run folder holds before its first checkpoint (``verlog train`` writes them first)
_RUN_FILES = ("config.yaml", "metrics.jsonl")


def _is_run_without_checkpoint(path: Path) -> bool:
    return not os.path.lexists(path / "config.json") and any(os.path.lexists(path / name) for name in _RUN_FILES)


def find_policy(spec: str | os.PathLike, *, base: str | os.PathLike | None = None) -> PolicySource:
    """The parts of the policy at ``spec`` (see the module doc), every folder checked; ``base``
    is the model LoRA adapters apply to (default: the one they were trained on)."""
    path = Path(spec).expanduser()
    if os.fspath(spec) in MODEL_SPECS or not path.is_dir():
        try:
            path = resolve_model_path(spec)  # a named model or a Hugging Face hub id
        except ModelNotFoundError as exc:
            raise ModelNotFoundError(
                f"no checkpoint in {os.fspath(spec)!r}: expected one of {', '.join(map(repr, MODEL_SPECS))}, an "
                f"existing folder (a Hugging Face model, a training run or checkpoint, LoRA adapters) or a Hugging "
                f"Face hub id ({exc.hub})",
                hub=exc.hub,
            ) from None
        return PolicySource(path, None, path)
    checkpoint = None
    if path.name in (ACTOR_FOLDER, ADAPTER_FOLDER) and os.path.lexists(path.parent / "state.json"):
        path = path.parent  # a checkpoint's actor named directly: the checkpoint, checked whole (links included)
    if not _is_checkpoint_source(path) and _is_run_without_checkpoint(path):
        raise FileNotFoundError(
            f"no checkpoint in {os.fspath(spec)!r}: this training run has saved none yet "
            "(one is written every trainer.save_every updates)"
        )
    if _is_checkpoint_source(path):
        checkpoint = resolve_checkpoint(path)
        verify_checkpoint(checkpoint)
        adapter = checkpoint / ADAPTER_FOLDER
        if not os.path.lexists(adapter):
            return PolicySource(checkpoint / ACTOR_FOLDER, None, checkpoint / ACTOR_FOLDER, checkpoint)
        path = adapter
    if not os.path.lexists(path / ADAPTER_CONFIG):
        return PolicySource(path, None, path, checkpoint)
    settings = check_adapter_folder(path)
    if base is None:
        base = settings.get("base_model_name_or_path")
        if not isinstance(base, str) or not base:
            raise CheckpointError(
                f"{path / ADAPTER_CONFIG} names no base model: give the base model's folder "
                "(serve-model --base-model, eval's model.path)"
            )
    try:
        base_path = resolve_model_path(base)
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"the base model of the adapters in {path} is not here ({exc}); give its folder "
            "(serve-model --base-model, eval's model.path)"
        ) from None
    return PolicySource(base_path, path, base_path, checkpoint)


def full_model_path(spec: str | os.PathLike) -> str:
    """What a config's ``model.path`` names as the full model to train or roll out: ``spec`` itself
    when it is a named model or a model folder, else the folder :func:`find_policy` finds (a run's
    or checkpoint's latest ``actor/``, a hub id's cached snapshot). A LoRA checkpoint is refused
    (``CheckpointError``): its adapters are no full model; its base is."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if text in MODEL_SPECS or (path.is_dir() and not _is_checkpoint_source(path)):
        return text
    source = find_policy(spec)
    if source.adapter is not None:
        raise CheckpointError(
            f"{source.label} holds LoRA adapters, not a full model: train or roll out its base (model.path="
            f"{source.model}, actor.lora...), or evaluate it with verlog eval --checkpoint {source.label}"
        )
    return str(source.model)


def check_finite_weights(model: Any, label: str) -> None:
    """Refuse (``CheckpointError``, naming the first such tensor) a model any of whose weights is
    NaN or infinite: it cannot answer, and every request it served would fail or be garbage."""
    import torch

    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise CheckpointError(
                    f"{label}: tensor {name} holds NaN or infinite values; these weights cannot "
                    "be served (was the training run diverging?)"
                )


def load_policy(source: PolicySource, *, dtype: Any = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``source``: the causal LM in eval mode on ``device`` (adapters
    merged), and the tokenizer with its chat template."""
    tokenizer = load_tokenizer(source.tokenizer)
    model = load_causal_lm(source.model, dtype=dtype, device="cpu")
    if source.adapter is not None:
        model = merge_adapter(model, source.adapter)
    check_finite_weights(model, source.label)
    model.to(device)
    model.eval()
    return model, tokenizer
