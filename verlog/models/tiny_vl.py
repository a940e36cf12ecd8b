"""The tiny random-init vision-language test model: ``Idefics3ForConditionalGeneration`` (the
SmolVLM architecture, ~0.7M parameters) with the tiny model's tokenizer and a processor.

Built in-process and deterministically, like ``tiny`` (:mod:`verlog.models.tiny`), so tests of
image turns never download anything:

* the tokenizer is ``tiny``'s, plus Idefics3's image tokens (``<fake_token_around_image>``,
  ``<image>``, ``<global-img>``, ``<end_of_utterance>``) as special tokens;
* the chat template is ``tiny``'s ChatML, an image part rendering as ``<image>``, which the
  processor expands into the image's tokens (:data:`IMAGE_SEQ_LEN` of them, between
  ``<fake_token_around_image><global-img>`` and ``<fake_token_around_image>``);
* the image processor resizes an image to at most 64 pixels a side (one 64 x 64 tile, no
  splitting: each image is :data:`IMAGE_SEQ_LEN` tokens);
* the vision tower is a 1-layer SigLIP-style encoder (16-pixel patches, 32 wide), its 16 patch
  states shuffled into 4 tokens of the 2-layer ``tiny``-shaped Qwen2 text model.

Use :func:`tiny_vl_model_dir` for the cached folder (``"tiny-vl"`` anywhere a model spec is taken).
"""

from __future__ import annotations

import os
from pathlib import Path

from verlog.models.quiet import quiet_progress_bars

__all__ = ["IMAGE_SEQ_LEN", "IMAGE_TOKENS", "TINY_VL_MODEL_NAME", "build_tiny_vl_model", "tiny_vl_model_dir"]

#: name of the cached folder; bump the suffix whenever the build below changes its output
TINY_VL_MODEL_NAME = "tiny-vl-v1"

#: Idefics3's image tokens, added to ``tiny``'s tokenizer as special tokens (in id order)
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")

#: the tokens one image becomes: (64 / 16 patches a side)^2 / (pixel shuffle 2)^2
IMAGE_SEQ_LEN = 4
_IMAGE_SIDE = 64


def build_tiny_vl_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny vision-language model, its tokenizer and processor into ``out_dir``.

    The result depends only on ``seed`` (weights) and this file: two builds give the same ids,
    pixels and bit-identical weights. Takes about a second on CPU."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from verlog.models.tiny import (
        SPECIAL_TOKENS,
        _patch_tokenizer_config,
        build_tiny_tokenizer,
        chatml_tool_template,
        seeded_model,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    specials = [*SPECIAL_TOKENS[1:], *IMAGE_TOKENS]  # replaces the list: tiny's own two come first
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = chatml_tool_template(image_text="<image>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text_config = {
        "model_type": "qwen2",
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }
    vision_config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": _IMAGE_SIDE,
        "patch_size": 16,
    }
    config = Idefics3Config(
        text_config=text_config,
        vision_config=vision_config,
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        dtype="float32",
    )
    model = seeded_model(Idefics3ForConditionalGeneration, config, seed, pad_id=pad_id, eos_id=eos_id)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": _IMAGE_SIDE}, max_image_size={"longest_edge": _IMAGE_SIDE}, do_image_splitting=False
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=tokenizer.chat_template,
    )
    with quiet_progress_bars():
        model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    _patch_tokenizer_config(out)
    return out


def tiny_vl_model_dir() -> Path:
    """The cached folder ``verlog_cache_dir()/models/tiny-vl-v1``, built on first use."""
    from verlog.models import verlog_cache_dir
    from verlog.models.tiny import build_cached

    return build_cached(verlog_cache_dir() / "models" / TINY_VL_MODEL_NAME, build_tiny_vl_model)
