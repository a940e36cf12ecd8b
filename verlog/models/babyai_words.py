"""``babyai-words``: a word-level model of the BabyAI text game, random init, for learning on a CPU.

The quick start (``configs/quickstart.yaml``) trains this model from scratch on BabyAI "go to"
through verlog's whole path (graph, recorder, fixed-turn batches, critic pre-training, PPO). A
135M-parameter instruct model needs minutes per update on two CPU cores; a model whose
vocabulary is the game's own words (~170) and whose weights are about 94 thousand floats runs
an update in seconds, so a few minutes of training show a real policy being learned.

* **Tokenizer**: a ``tokenizers`` word-level model. Text is lower-cased and split into words and
  punctuation runs; every word of the BabyAI text game (BALROG's wording and verlog's: colours,
  objects, door states, numbers, directions, the instructions' words) has its own id, anything
  else becomes ``[UNK]``. The four two-word actions (``turn left``, ``turn right``, ``go forward``,
  ``pick up``) are single tokens, like ``drop`` and ``toggle``: one sampled token is one action,
  the bare action name that both protocols' parsers accept. Decoding joins tokens with spaces.
* **Chat template**: each message opens with ``<|im_start|>`` and its role; the answer follows
  the last message at once (no generation prompt), as for :mod:`verlog.models.toy`.
* **Model**: ``Qwen2ForCausalLM``, hidden 128, 2 layers, 4 heads, MLP 256, tied embeddings,
  512 positions (~351k parameters), initialised under a fixed seed.

Saved as an ordinary Hugging Face folder (``PreTrainedTokenizerFast``: ``load_tokenizer`` gives
the same ids), built deterministically and cached under ``verlog_cache_dir()/models``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "BABYAI_WORDS",
    "BABYAI_ACTION_TOKENS",
    "BABYAI_WORDS_MODEL_NAME",
    "build_babyai_words_tokenizer",
    "build_babyai_words_model",
    "babyai_words_dir",
]

#: bump when the build below changes its output
BABYAI_WORDS_MODEL_NAME = "babyai-words-v1"


#: the game's actions that are more than one word, each one token (matched before word splitting)
BABYAI_ACTION_TOKENS: tuple[str, ...] = ("turn left", "turn right", "go forward", "pick up")

#: the ordinary words: chat roles, the game's text under both protocols, punctuation
BABYAI_WORDS: tuple[str, ...] = tuple(
    """
    system user assistant
    drop toggle done
    red green blue purple yellow grey
    ball box key door wall goal floor lava
    open closed locked unlocked empty
    0 1 2 3 4 5 6 7 8 9 10 64 128
    step steps forward left right ahead front behind
    a an the you your is are of to in on and or it its at one
    carry carrying nothing directly see mission
    go turn pick up put next then after
    current observation observe observations shown
    agent small grid world rooms room cells cell area
    action actions take each followed by what does can will now be
    move act interact object objects want when while with
    repeating pointless same stays tips play these acts answering
    answer answers exactly listed above else keep every until episode ends
    last was not valid default taken so instead named no
    think briefly about do end line form where
    most at least
    . , : ; ! ? ' " ( ) - ). ).
    """.split()
)


def _unique(words: tuple[str, ...]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for w in words:
        seen.setdefault(w, None)
    return tuple(seen)


#: bare words whose ids are the vocabulary (after the specials and the action tokens)
_VOCAB_WORDS = _unique(BABYAI_WORDS)


def build_babyai_words_tokenizer():
    """The word-level tokenizer (a ``transformers.PreTrainedTokenizerFast``), see the module doc."""
    from verlog.models.word_level import build_word_tokenizer

    return build_word_tokenizer(BABYAI_ACTION_TOKENS, _VOCAB_WORDS, split_digits=False)


def build_babyai_words_model(
    out_dir: str | os.PathLike, seed: int = 0, *, hidden_size: int = 128, num_layers: int = 2
) -> Path:
    """Build the model (random init under ``seed``) and its tokenizer into ``out_dir``; the
    named model is the default size (``hidden_size`` 128, ``num_layers`` 2)."""
    from verlog.models.word_level import save_word_model

    return save_word_model(
        out_dir,
        build_babyai_words_tokenizer(),
        seed=seed,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_positions=512,
    )


def babyai_words_dir() -> Path:
    """The cached ``babyai-words`` folder, built on first use (about a second)."""
    from verlog.models.word_level import cached_word_model

    return cached_word_model(BABYAI_WORDS_MODEL_NAME, build_babyai_words_model)
