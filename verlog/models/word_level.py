"""What verlog's word-level models share: the special tokens, the minimal chat template, the
tokenizer wrapper and the random-init Qwen2 they are saved as.

A word-level model (``toy`` for the cue corridor, ``babyai-words`` for BabyAI, ``crafter-words``
for Crafter, ``sokoban-words`` for Sokoban) gives each word of a small closed vocabulary its own id,
so a policy can be learned from scratch on a CPU and its chance level stays honest. Each game's
module brings its vocabulary; :func:`build_word_tokenizer` turns it into a tokenizer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

__all__ = [
    "SPECIALS",
    "WORD_CHAT_TEMPLATE",
    "build_word_tokenizer",
    "cached_word_model",
    "save_word_model",
    "word_pre_tokenizer",
    "wrap_word_tokenizer",
]

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


def word_pre_tokenizer(split_digits: bool):
    """How a word-level tokenizer splits text: words (``\\w+``) and punctuation runs, and with
    ``split_digits`` every digit on its own (``400`` is ``4 0 0``)."""
    from tokenizers import pre_tokenizers

    if not split_digits:
        return pre_tokenizers.Whitespace()
    return pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])


def build_word_tokenizer(
    multi_word: tuple[str, ...],
    words: tuple[str, ...],
    *,
    split_digits: bool,
    line_break: str | None = None,
    max_length: int = 512,
) -> Any:
    """A word-level tokenizer (``PreTrainedTokenizerFast`` with the chat template) whose ids are
    :data:`SPECIALS`, then ``multi_word`` (phrases kept whole, e.g. two-word actions, matched on
    the lower-cased text before splitting), then ``words``; anything else is ``[UNK]``.

    Text is lower-cased and split by :func:`word_pre_tokenizer`. ``line_break``: a punctuation
    mark (not a word character) that stands for each line break, so that where lines end (the rows
    of a drawn map) is a token; by default line breaks are spaces. Decoding joins tokens with spaces.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + multi_word + words)}
    if len(vocab) != len(SPECIALS) + len(multi_word) + len(words):
        raise ValueError("a word-level vocabulary lists a token twice")
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    if line_break is None:
        backend.normalizer = normalizers.Lowercase()
    else:
        if line_break not in vocab:
            raise ValueError(f"the line-break mark {line_break!r} is not in the vocabulary")
        backend.normalizer = normalizers.Sequence(
            [normalizers.Replace("\n", f" {line_break} "), normalizers.Lowercase()]
        )
    backend.pre_tokenizer = word_pre_tokenizer(split_digits)
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if multi_word:
        backend.add_tokens([AddedToken(t, special=False, normalized=True, single_word=True) for t in multi_word])
    return wrap_word_tokenizer(backend, max_length=max_length)


def save_word_model(
    out_dir: str | os.PathLike, tokenizer: Any, *, seed: int, hidden_size: int, num_layers: int, max_positions: int
) -> Path:
    """Save a random-init Qwen2 (``seed``) for ``tokenizer`` and the tokenizer into ``out_dir``,
    reloadable by ``verlog.models.load_tokenizer`` with the same ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlog.models.quiet import quiet_progress_bars
    from verlog.models.tiny import seeded_model

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
    model = seeded_model(Qwen2ForCausalLM, config, seed, pad_id=pad_id, eos_id=eos_id)
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
    from verlog.cache import verlog_cache_dir
    from verlog.models.tiny import build_cached

    return build_cached(verlog_cache_dir() / "models" / name, build)
