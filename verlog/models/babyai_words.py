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
* **Model**: ``Qwen2ForCausalLM``, hidden 64, 2 layers, 4 heads, MLP 128, tied embeddings,
  512 positions (~94k parameters), initialised under a fixed seed.

Saved as an ordinary Hugging Face folder (``PreTrainedTokenizerFast``: ``load_tokenizer`` gives
the same ids), built deterministically and cached under ``verlog_cache_dir()/models``.
"""

from __future__ import annotations

import json
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

_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")

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

#: each message opens with its role; the answer follows the last message directly
_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %} {% endif %}"
    "<|im_start|>{{ m['role'] }} {{ m['content'] }}{% endfor %}"
)


def build_babyai_words_tokenizer():
    """The word-level tokenizer (a ``transformers.PreTrainedTokenizerFast``), see the module doc."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + BABYAI_ACTION_TOKENS + _VOCAB_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation runs
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIALS])
    # the multi-word actions: whole tokens, matched on the lower-cased text before splitting
    backend.add_tokens([AddedToken(t, special=False, normalized=True, single_word=True) for t in BABYAI_ACTION_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def build_babyai_words_model(
    out_dir: str | os.PathLike, seed: int = 0, *, hidden_size: int = 64, num_layers: int = 2
) -> Path:
    """Build the model (random init under ``seed``) and its tokenizer into ``out_dir``; the
    named model is the default size (``hidden_size`` 64, ``num_layers`` 2)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlog.models.quiet import quiet_progress_bars

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_babyai_words_tokenizer()
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
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


def babyai_words_dir() -> Path:
    """The cached ``babyai-words`` folder, built on first use (about a second)."""
    from verlog.models import verlog_cache_dir
    from verlog.models.tiny import build_cached

    return build_cached(verlog_cache_dir() / "models" / BABYAI_WORDS_MODEL_NAME, build_babyai_words_model)
