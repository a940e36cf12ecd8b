"""The embedded engine's device-side decode step: random streams, stop strings, grammar masks."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

from verlog.backends.base import SamplingParams, ends_with_stop
from verlog.backends.decode_rows import DecodeRows, RowSpec, filtered_probs, seed_stream, uniforms, unpack_bitmask
from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.stop_strings import StopStrings, byte_automaton

MASK64 = 2**64 - 1


def splitmix64_reference(seed: int, counter: int) -> float:
    """splitmix64 in plain Python integers (mod 2**64), top 24 bits as a fraction."""
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 40) / 2**24


def test_uniforms_are_splitmix64_and_uniform():
    """torch's int64 arithmetic must wrap exactly as the reference does; the numbers look uniform."""
    seeds = [0, 1, -1, 2**63 - 1, -(2**63), 123456789, seed_stream(2**64 + 5)]
    counters = [0, 1, 7, 1000, 2**40]
    s = torch.tensor([seed_stream(x) for x in seeds for _ in counters])
    c = torch.tensor([n for _ in seeds for n in counters])
    got = uniforms(s, c).tolist()
    want = [splitmix64_reference(x % 2**64, n) for x in seeds for n in counters]
    assert got == want
    many = uniforms(torch.full((200_000,), 42), torch.arange(200_000))
    assert float(many.min()) >= 0 and float(many.max()) < 1
    hist = torch.histc(many, bins=10, min=0, max=1) / len(many)
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.005)


def test_kmp_automaton_finds_every_occurrence():
    delta = byte_automaton(b"abab")
    rng = random.Random(0)
    for _ in range(300):
        text = bytes(rng.choice(b"ab") for _ in range(12))
        q, seen_at = 0, None
        for i, byte in enumerate(text):
            q = int(delta[q, byte])
            if q == 4 and seen_at is None:
                seen_at = i + 1
        want = text.find(b"abab")
        assert seen_at == (None if want < 0 else want + 4)


@pytest.mark.parametrize("name", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_stop_strings_on_the_device_match_decoding_the_text(name):
    """After every token, the device table says "stop" exactly when the decoded response contains
    a stop string (what engines without the table check), on random token sequences."""
    from verlog.models import load_tokenizer

    tok = load_tokenizer(name)
    stops = ["ACTION:", "\n\n", "</tool_call>", "aa", "é!"]
    table = StopStrings(tok, len(tok) + 3, torch.device("cpu"))
    starts = table.start_states(stops)
    assert table.known(stops) == starts and table.known(["never seen"]) is None
    rng = random.Random(0)
    base = tok.encode("hello ACTION: go\n\nthe </tool_call> aaa é! x ACTIO N: ééé " * 3, add_special_tokens=False)
    checked = 0
    for _ in range(150):
        ids = [rng.choice(base) if rng.random() < 0.7 else rng.randrange(len(tok)) for _ in range(30)]
        states = torch.tensor([starts])  # all five strings on one row
        for n in range(1, len(ids) + 1):
            hit = bool(table.advance(states, torch.tensor([ids[n - 1]]))[0])
            assert hit == ends_with_stop(tok, ids[:n], tuple(stops)), tok.decode(ids[:n])
            checked += 1
            if hit:
                break
    assert checked > 1000


def test_a_full_table_leaves_stop_strings_to_the_host(tiny_model, tiny_tokenizer):
    """A request whose stop strings do not fit in the device table is checked on the host, and
    gets the same response."""
    prompt = tiny_tokenizer("once upon a time", add_special_tokens=False)["input_ids"]

    async def run(engine: EmbeddedEngine):
        free = await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=24))
        stop = tiny_tokenizer.decode(free.token_ids)[-4:-1]
        cut = await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=24, stop=(stop,)))
        engine.close()
        return free, cut, stop

    on_device = EmbeddedEngine(tiny_model, tiny_tokenizer)
    free, cut, stop = asyncio.run(run(on_device))
    assert cut.finish_reason == "stop" and stop in tiny_tokenizer.decode(cut.token_ids)
    assert len(cut.token_ids) < len(free.token_ids)
    on_host = EmbeddedEngine(tiny_model, tiny_tokenizer)
    on_host.stop_strings.max_states = 1  # nothing fits
    _, host_cut, _ = asyncio.run(run(on_host))
    assert host_cut.token_ids == cut.token_ids and host_cut.finish_reason == "stop"


def test_unpack_bitmask_matches_numpy():
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32)
    bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little").reshape(3, -1).astype(bool)
    assert torch.equal(unpack_bitmask(words, 150), torch.from_numpy(bits[:, :150]))
    wide = unpack_bitmask(words, 170)
    assert wide.shape == (3, 170) and not wide[:, 160:].any()


def test_top_k_and_top_p_truncation():
    logprobs = torch.log_softmax(torch.tensor([[4.0, 3.0, 2.0, 1.0]] * 3), dim=-1)
    probs = filtered_probs(logprobs, torch.tensor([2, -1, -1]), torch.tensor([1.0, 0.5, 1.0]))
    assert (probs[0, 2:] == 0).all() and probs[0, :2].sum() == pytest.approx(1)
    assert probs[1, 0] == pytest.approx(1)  # the first token alone reaches half the mass
    assert torch.allclose(probs[2], logprobs[2].exp())


def test_a_row_samples_the_same_tokens_in_any_batch():
    """A row's choice depends only on its logits and its own stream, not on the rows beside it."""
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    specs = [RowSpec(1.0, -1, 1.0, seed=i, limit=8, stop_ids=(3,)) for i in range(6)]
    specs[2] = RowSpec(0.0, -1, 1.0, seed=2, limit=8, stop_ids=(3,))  # greedy
    specs[4] = RowSpec(0.7, 5, 0.9, seed=4, limit=8, stop_ids=())
    together = DecodeRows(specs, torch.device("cpu"))
    tokens, logprobs, _ = together.choose(logits.clone())
    for row in range(6):
        alone = DecodeRows([specs[row]], torch.device("cpu"))
        t, lp, _ = alone.choose(logits[row : row + 1].clone())
        assert int(t) == int(tokens[row]) and float(lp) == pytest.approx(float(logprobs[row]))
    assert int(tokens[2]) == int(logits[2].argmax())
    temps = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.7, 1.0])
    expected = torch.log_softmax(logits / temps[:, None], -1).gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)


def test_outputs_stop_ids_and_limits_are_tracked_per_row():
    rows = DecodeRows(
        [RowSpec(0.0, -1, 1.0, 0, limit=3, stop_ids=(7,)), RowSpec(0.0, -1, 1.0, 1, limit=100, stop_ids=(7,))],
        torch.device("cpu"),
    )
    picks = [(1, 2), (7, 2), (4, 5)]
    for a, b in picks:
        logits = torch.full((2, 10), -5.0)
        logits[0, a] = logits[1, b] = 5.0
        _, _, stopped = rows.choose(logits)
    assert stopped.tolist() == [False, False] and rows.at_limit().tolist() == [True, False]
    (ids0, lp0), (ids1, _) = rows.outputs([0, 1])
    assert ids0 == [1, 7, 4] and ids1 == [2, 2, 5] and len(lp0) == 3
    rows.select([1])
    logits = torch.full((1, 10), -5.0)
    logits[0, 7] = 5.0
    assert rows.choose(logits)[2].tolist() == [True]
    assert rows.outputs([0]) == [([2, 2, 5, 7], pytest.approx(rows.outputs([0])[0][1]))]
