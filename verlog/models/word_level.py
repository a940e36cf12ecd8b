"""What verlog's word-level models share: the special tokens, the minimal chat template, the
tokenizer wrapper and the random-init Qwen2 they are saved as.

A word-level model (``toy`` for the cue corridor, ``babyai-words`` for BabyAI) gives each word of
a small closed vocabulary its own id, so a policy can be learned from scratch on a CPU and its
chance level stays honest. Each module brings its own vocabulary and word splitting.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["SPECIALS", "WORD_CHAT_TEMPLATE", "cached_word_model", "save_word_model", "wrap_word_tokenizer"]

#: the special tokens, in id order (0 pads, 2 ends an answer)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")

#: each message opens with its role; the answer follows the last message directly, so the model
#: answers at the position of the last word it was shown
WORD_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %} {% endif %}"
    "<|im_start|>{{ m['role'] }} {{ m['content'] }}{% endfor %}"
)


def wrap_word_tokenizer(backend: Any, max_length: int) -> Any:
    """A ``tokenizers`` word-level backend as a ``PreTrainedTokenizerFast`` with the chat template."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )
    tokenizer.chat_template = WORD_CHAT_TEMPLATE
    return tokenizer


def save_word_model(
    out_dir: str | os.PathLike, tokenizer: Any, *, seed: int, hidden_size: int, num_layers: int, max_positions: int
) -> Path:
    """Save a random-init Qwen2 (``seed``) for ``tokenizer`` and the tokenizer into ``out_dir``,
    reloadable by ``verlog.models.load_tokenizer`` with the same ids."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlog.models.quiet import quiet_progress_bars

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        use_sliding_window=False,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    with quiet_progress_bars():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # reload from tokenizer.json, same ids
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out


def cached_word_model(name: str, build: Callable[[Path], Path]) -> Path:
    """The folder of the named word-level model under ``verlog_cache_dir()/models``, built with
    ``build(folder)`` on first use (atomically: ``verlog.models.tiny.build_cached``)."""
    from verlog.models import verlog_cache_dir
    from verlog.models.tiny import build_cached

    return build_cached(verlog_cache_dir() / "models" / name, build)
