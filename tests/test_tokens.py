"""verlog.tokens: the pad-id rule and the common-prefix length the engine, the trainer and verl's agent loop share."""

from __future__ import annotations

from verlog.tokens import common_prefix_len, pad_token_id


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
