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

from verlog.models.word_level import SPECIALS as _SPECIALS

__all__ = ["TOY_WORDS", "TOY_MODEL_NAME", "build_toy_model", "toy_model_dir"]

#: bump when the build below changes its output
TOY_MODEL_NAME = "toy-words-v2"


#: the 36 ordinary words (ids 4..39): chat roles, the corridor's text, and distractors
TOY_WORDS: tuple[str, ...] = (
    "system",
    "user",
    "assistant",
    "walk",
    "the",
    "corridor",
    "pos",
    "of",
    "cue",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "red",
    "green",
    "blue",
    "yellow",
    "north",
    "south",
    "east",
    "west",
    "wall",
    "door",
    "key",
    "ball",
    "box",
    "left",
    "right",
    "up",
    "down",
)


def _tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from verlog.models.word_level import wrap_word_tokenizer

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + TOY_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIALS])
    return wrap_word_tokenizer(backend, max_length=256)


def build_toy_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the toy model (hidden 64, 2 layers, 4 heads, 40 words) and tokenizer into ``out_dir``."""
    from verlog.models.word_level import save_word_model

    return save_word_model(out_dir, _tokenizer(), seed=seed, hidden_size=64, num_layers=2, max_positions=256)


def toy_model_dir() -> Path:
    """The cached toy model folder, built on first use."""
    from verlog.models.word_level import cached_word_model

    return cached_word_model(TOY_MODEL_NAME, build_toy_model)
