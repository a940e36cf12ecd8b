"""``sokoban-words``: a word-level model of the Sokoban text game, random init, for learning on a CPU.

The Sokoban learning benchmark (``benchmarks/sokoban_learning.py``, ``configs/sokoban_words.yaml``)
trains this model from scratch on verl-agent's Sokoban (``graphs/sokoban.py``, unchanged: 6x6
rooms, one box, 15 moves). As ``babyai-words`` is for BabyAI and ``crafter-words`` for Crafter, it
is small enough for an update in seconds on two CPU cores, and its vocabulary is the game's own, so
its chance level stays honest.

* **Tokenizer**: a word-level tokenizer (:func:`verlog.models.word_level.build_word_tokenizer`).
  Text is lower-cased and split into words, punctuation runs and single digits; a line break is
  the token ``¶``, so the rows of the room stay visible whatever its size. The vocabulary is read
  from the game itself (:func:`sokoban_vocabulary`): the cell symbols
  (:data:`verlog.envs.sokoban.SYMBOLS`, one token each: the text view pads every cell with
  spaces), the four moves, and every word of verlog's prompt around the room (the game's
  instruction, the ``Current Observation:`` header, the invalid-answer note naming the no-op).
  Each move is a single token that decodes to its own name, so one sampled token is one move.
  Anything else becomes ``[UNK]``.
* **Chat template**: each message opens with ``<|im_start|>`` and its role; the answer follows
  the last message at once (:data:`verlog.models.word_level.WORD_CHAT_TEMPLATE`).
* **Model**: ``Qwen2ForCausalLM``, hidden 128, 2 layers, 4 heads, MLP 256, tied embeddings,
  512 positions (about 0.4M parameters), initialised under a fixed seed.

The cached folder's name carries a digest of the vocabulary (:func:`sokoban_words_model_name`), so
a change of the game's wording builds a new model instead of reusing a stale one. Saved as an
ordinary Hugging Face folder, built deterministically under ``verlog_cache_dir()/models``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "LINE_BREAK",
    "build_sokoban_words_model",
    "build_sokoban_words_tokenizer",
    "sokoban_texts",
    "sokoban_vocabulary",
    "sokoban_words_dir",
    "sokoban_words_model_name",
]

#: bump when the build below changes its output (the vocabulary's own changes are in the digest)
_VERSION = "v1"
#: the token a line break becomes (a punctuation mark: never part of a word)
LINE_BREAK = "¶"
#: the model's size
_HIDDEN, _LAYERS, _POSITIONS = 128, 2, 512


def sokoban_texts() -> tuple[str, ...]:
    """The texts around the room that verlog's Sokoban prompt can show: the game's instruction
    (with its rules, symbols, moves and answer format), the chat roles, the observation header,
    and the note after an answer that named no move."""
    from verlog.envs.agent_graph import build_prompt, invalid_answer_feedback
    from verlog.envs.sokoban import NO_OP, SokobanEnv

    frame = build_prompt("", [], "", 0, invalid_answer_feedback(NO_OP))
    return (SokobanEnv().instruction, "system user assistant", *(str(m.content) for m in frame))


def sokoban_vocabulary() -> tuple[str, ...]:
    """The ordinary tokens (after the specials), in a fixed order: the four moves, the digits, the
    cell symbols, the line-break mark, then every other word of :func:`sokoban_texts` (lower-cased
    and split as the tokenizer splits text), each once."""
    from verlog.envs.sokoban import ACTIONS, SYMBOLS
    from verlog.models.word_level import word_pre_tokenizer

    split = word_pre_tokenizer(split_digits=True)
    words = [w for text in sokoban_texts() for w, _ in split.pre_tokenize_str(text.lower())]
    symbols = [s.lower() for s in SYMBOLS.values()]
    return tuple(dict.fromkeys([*ACTIONS, *map(str, range(10)), *symbols, LINE_BREAK, *words]))


def sokoban_words_model_name() -> str:
    """The cached folder's name: the build's version and a digest of the vocabulary."""
    digest = hashlib.sha256("\n".join(sokoban_vocabulary()).encode("utf-8")).hexdigest()[:10]
    return f"sokoban-words-{_VERSION}-{digest}"


def build_sokoban_words_tokenizer():
    """The word-level tokenizer (a ``transformers.PreTrainedTokenizerFast``), see the module doc."""
    from verlog.models.word_level import build_word_tokenizer

    return build_word_tokenizer(
        (), sokoban_vocabulary(), split_digits=True, line_break=LINE_BREAK, max_length=_POSITIONS
    )


def build_sokoban_words_model(
    out_dir: str | os.PathLike, seed: int = 0, *, hidden_size: int = _HIDDEN, num_layers: int = _LAYERS
) -> Path:
    """Build the model (random init under ``seed``) and its tokenizer into ``out_dir``; the
    named model is the default size (``hidden_size`` 128, ``num_layers`` 2)."""
    from verlog.models.word_level import save_word_model

    return save_word_model(
        out_dir,
        build_sokoban_words_tokenizer(),
        seed=seed,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_positions=_POSITIONS,
    )


def sokoban_words_dir() -> Path:
    """The cached ``sokoban-words`` folder, built on first use (about a second)."""
    from verlog.models.word_level import cached_word_model

    return cached_word_model(sokoban_words_model_name(), build_sokoban_words_model)
