"""The ``babyai-words`` model of the quick start: its vocabulary covers the BabyAI text game, each
action is one token that decodes to the action's name, and the build is deterministic."""

from __future__ import annotations

import random

import pytest
import torch
from langchain_core.messages import convert_to_openai_messages

from verlog.envs import balrog_protocol
from verlog.envs.babyai.env import ACTIONS
from verlog.envs.registry import make_env
from verlog.models import MODEL_SPECS, load_causal_lm, load_tokenizer, resolve_model_path
from verlog.models.babyai_words import BABYAI_WORDS_MODEL_NAME, build_babyai_words_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_babyai_words_model(tmp_path_factory.mktemp("babyai-words"))


@pytest.fixture(scope="module")
def tok(built):
    return load_tokenizer(built)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_named_spec_builds_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path))
    assert "babyai-words" in MODEL_SPECS
    folder = resolve_model_path("babyai-words")
    assert folder == tmp_path / "models" / BABYAI_WORDS_MODEL_NAME
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert resolve_model_path("babyai-words") == folder  # cached: not rebuilt


def test_size_and_one_token_forward(built, tok):
    model = load_causal_lm(built)
    params = sum(p.numel() for p in model.parameters())
    assert 50_000 < params < 1_000_000
    assert model.config.vocab_size == len(tok) < 300
    ids = torch.tensor([_ids(tok, "go to the red ball a wall 2 steps forward")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()


def test_each_action_is_one_token_decoding_to_its_name(tok):
    for action in ACTIONS:
        ids = _ids(tok, action)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id, action
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert decoded == action
        assert balrog_protocol.parse_answer(decoded, ACTIONS) == action  # BALROG's exact-match rule
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""  # an empty answer is invalid


@pytest.mark.parametrize("protocol", ["balrog", "verlog"])
def test_the_game_text_has_no_unknown_words(tok, protocol):
    """Every word of goto's observations (both protocols) and of BALROG's instruction is known."""
    rng = random.Random(0)
    env = make_env("babyai:goto", protocol=protocol)
    texts = []
    for seed in range(20):
        texts.append(env.reset(seed))
        if protocol == "balrog":
            texts.append(env.instruction)
        for _ in range(30):
            result = env.step(rng.choice(ACTIONS))
            texts.append(result.observation)
            if result.done:
                break
    unknown = {w for text in texts for w, i in zip(tok.tokenize(text), _ids(tok, text)) if i == tok.unk_token_id}
    assert not unknown


def test_chat_template_answer_follows_the_last_message(tok):
    env = make_env("babyai:goto", protocol="balrog")
    prompt = balrog_protocol.build_prompt("go to the red ball", [], env.reset(3), 0)
    text = tok.apply_chat_template(convert_to_openai_messages(prompt), tokenize=False)
    assert text.startswith("<|im_start|>user go to the red ball <|im_start|>user Current Observation:")
    assert text.endswith(balrog_protocol.ANSWER_RULE)  # no generation prompt: the answer comes next
    assert _ids(tok, text).count(tok.convert_tokens_to_ids("<|im_start|>")) == 2


def test_build_is_deterministic(tmp_path, built, tok):
    again = build_babyai_words_model(tmp_path / "again")
    assert load_tokenizer(again).get_vocab() == tok.get_vocab()
    first, second = load_causal_lm(built).state_dict(), load_causal_lm(again).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
