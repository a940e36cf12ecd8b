"""A word-level toy model for learning on a CPU: an 85k-parameter random-init Qwen2, 40 words.

The CPU learning proof (``tests/test_learning.py``, ``benchmarks/learning_curve.py``) trains
this model from scratch on ``graphs/cue_corridor.py`` through the whole path (graph, recorder,
fixed-turn batches, critic pre-training, PPO). A vocabulary of whole words keeps the task's
chance level honest (one word in 40) and the model small enough to learn in a few minutes on
two cores.

The tokenizer is a ``tokenizers`` word-level model (whitespace split, unknown words become
``[UNK]``) with a minimal chat template (each message opens with ``<|im_start|>`` and its role;
the answer follows the last message at once), saved as a ``PreTrainedTokenizerFast`` folder that
``verlog.models.load_tokenizer`` reloads with the same ids. Built deterministically and cached
under ``verlog_cache_dir()/models``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TOY_WORDS", "TOY_MODEL_NAME", "build_toy_model", "toy_model_dir"]

#: bump when the build below changes its output
TOY_MODEL_NAME = "toy-words-v2"

_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")

#: the 36 ordinary words (ids 4..39): chat roles, the corridor's text, and distractors
TOY_WORDS: tuple[str, ...] = (
    "system", "user", "assistant",
    "walk", "the", "corridor", "pos", "of", "cue",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
    "red", "green", "blue", "yellow",
    "north", "south", "east", "west",
    "wall", "door", "key", "ball", "box", "left", "right", "up", "down",
)

#: each message opens with its role; the answer follows the last message directly, so the model
#: answers at the position of the last word it was shown (the corridor's cue)
_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %} {% endif %}"
    "<|im_start|>{{ m['role'] }} {{ m['content'] }}{% endfor %}"
)


def _tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + TOY_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIALS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=256,
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def build_toy_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the toy model (hidden 64, 2 layers, 4 heads, 40 words) and tokenizer into ``out_dir``."""
    import json

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlog.models.quiet import quiet_progress_bars

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
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


def toy_model_dir() -> Path:
    """The cached toy model folder, built on first use."""
    from verlog.models import verlog_cache_dir
    from verlog.models.tiny import build_cached

    return build_cached(verlog_cache_dir() / "models" / TOY_MODEL_NAME, build_toy_model)
