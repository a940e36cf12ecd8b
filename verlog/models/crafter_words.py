"""``crafter-words``: a word-level model of the Crafter text game, random init, for learning on a CPU.

The long-horizon benchmark (``benchmarks/long_horizon.py``) trains this model from scratch on
Crafter (``graphs/crafter.py``, verlog's text, episodes of up to 400 steps) through verlog's whole
path. As ``babyai-words`` is for BabyAI, it is small enough for an update in seconds on two CPU
cores, and its vocabulary is the game's own words, so its chance level stays honest.

* **Tokenizer**: a ``tokenizers`` word-level model. Text is lower-cased and split into words,
  punctuation runs and single digits (``400`` is ``4 0 0``: every step number and count is
  known). The vocabulary is read from the game itself: Crafter's materials, creatures, items and
  achievements (``crafter.constants``) and the words of verlog's observation text and prompt
  (:func:`verlog.envs.crafter.env.describe`, the invalid-answer note). Each of the 17 actions is a
  single token (``make wood pickaxe`` included) that decodes to the action's name, so one
  sampled token is one action. Anything else becomes ``[UNK]``.
* **Chat template**: each message opens with ``<|im_start|>`` and its role; the answer follows
  the last message at once (:data:`verlog.models.word_level.WORD_CHAT_TEMPLATE`).
* **Model**: ``Qwen2ForCausalLM``, hidden 128, 2 layers, 4 heads, MLP 256, tied embeddings,
  512 positions (about 0.4M parameters), initialised under a fixed seed.

Saved as an ordinary Hugging Face folder, built deterministically and cached under
``verlog_cache_dir()/models``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "CRAFTER_WORDS_MODEL_NAME",
    "crafter_action_tokens",
    "crafter_vocabulary",
    "build_crafter_words_tokenizer",
    "build_crafter_words_model",
    "crafter_words_dir",
]

#: bump when the build below changes its output
CRAFTER_WORDS_MODEL_NAME = "crafter-words-v1"

#: the words of verlog's Crafter prompt that are not game names: chat roles, the observation's
#: fixed wording (``describe``), the prompt's headers and the invalid-answer note
_PROMPT_WORDS = """
system user assistant
it is daytime night step steps you see up to left right and down in view next
are facing toward the edge of world asleep status inventory empty ripe young
current observation crafter
your last answer named no valid action so was done instead
. , : ; ( ) ' / - ): ). '.
""".split()


def crafter_action_tokens() -> tuple[str, ...]:
    """Crafter's 17 actions as verlog names them (``move left``, ``make wood pickaxe``...)."""
    from verlog.envs.crafter.env import ACTIONS

    return ACTIONS


def crafter_vocabulary() -> tuple[str, ...]:
    """The ordinary words (after the specials and the action tokens): digits, the game's names
    (materials, creatures, items and achievements, split into words) and the prompt's words."""
    from crafter import constants

    names = [
        *constants.materials,
        *constants.items,
        *constants.achievements,
        "cow",
        "zombie",
        "skeleton",
        "arrow",
        "plant",
        "fence",
        "pickaxe",
        "sword",
    ]
    words = [str(d) for d in range(10)] + [w for name in names for w in name.split("_")] + _PROMPT_WORDS
    actions = set(crafter_action_tokens())
    return tuple(dict.fromkeys(w for w in words if w not in actions))  # unique, in first-seen order


def build_crafter_words_tokenizer():
    """The word-level tokenizer (a ``transformers.PreTrainedTokenizerFast``), see the module doc."""
    from verlog.models.word_level import build_word_tokenizer

    multi_word = tuple(a for a in crafter_action_tokens() if " " in a)
    single_word = tuple(a for a in crafter_action_tokens() if " " not in a)
    return build_word_tokenizer(multi_word, single_word + crafter_vocabulary(), split_digits=True)


def build_crafter_words_model(
    out_dir: str | os.PathLike, seed: int = 0, *, hidden_size: int = 128, num_layers: int = 2
) -> Path:
    """Build the model (random init under ``seed``) and its tokenizer into ``out_dir``; the
    named model is the default size (``hidden_size`` 128, ``num_layers`` 2)."""
    from verlog.models.word_level import save_word_model

    return save_word_model(
        out_dir,
        build_crafter_words_tokenizer(),
        seed=seed,
        hidden_size=hidden_size,
        num_layers=num_layers,
        max_positions=512,
    )


def crafter_words_dir() -> Path:
    """The cached ``crafter-words`` folder, built on first use (about a second)."""
    from verlog.models.word_level import cached_word_model

    return cached_word_model(CRAFTER_WORDS_MODEL_NAME, build_crafter_words_model)
