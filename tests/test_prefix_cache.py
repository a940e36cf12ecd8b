"""The prefix cache kept across calls: the radix tree itself, and the embedded engine using it.

Greedy outputs and logprobs are the same with and without the cache (alone, in batches mixing
cached and uncached prompts, across chat turns whose prompt extends the previous one), the engine's
stats say what was computed and what was served from the cache, the cache stays within its bytes,
and a weight update under ``engine.weights_lock()`` invalidates it.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from verlog.backends.base import Generation, SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.prefix_cache import PrefixCache

SYSTEM = (
    "<|im_start|>system\nYou are an agent in a grid world. Valid actions: turn left, turn right, "
    "go forward, pick up, drop, toggle. End with ACTION: <action>.<|im_end|>\n"
)
GREEDY = SamplingParams(temperature=0, max_new_tokens=10)


def user(tokenizer, text: str) -> list[int]:
    return tokenizer(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]


def system(tokenizer) -> list[int]:
    return tokenizer(SYSTEM, add_special_tokens=False)["input_ids"]


def kv(tokens: int, fill: float = 0.0) -> torch.Tensor:
    """Fake KV of ``tokens`` tokens: 2 layers, 1 head, head dim 4 (32 bytes a token and layer)."""
    return torch.full((2, 2, 1, tokens, 4), fill)


def assert_same(with_cache: list[Generation], without: list[Generation]) -> None:
    for a, b in zip(with_cache, without, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


@pytest.fixture()
def engines(tiny_model, tiny_tokenizer):
    on = EmbeddedEngine(tiny_model, tiny_tokenizer, max_batch_size=8)
    off = EmbeddedEngine(tiny_model, tiny_tokenizer, max_batch_size=8, prefix_cache_bytes=0)
    yield on, off
    on.close()
    off.close()


# ----------------------------------------------------------------------------------- the tree
def test_tree_matches_splits_and_serves_the_kv_of_each_token():
    cache = PrefixCache(1 << 20)
    seq = [1, 2, 3, 4, 5, 6]
    asked: list[tuple[int, int]] = []

    def source(tokens):
        def kv_for(start, end):
            asked.append((start, end))
            return torch.stack([kv(1, float(t)) for t in tokens[start:end]], dim=3)[:, :, :, :, 0]

        return kv_for

    assert cache.insert(seq, source(seq)) == 6
    other = [1, 2, 3, 9, 9]
    assert cache.insert(other, source(other)) == 2 and asked[-1] == (3, 5)  # only the new part is asked
    n, got = cache.match([1, 2, 3, 4, 7], limit=10)
    assert n == 4 and got[0, 0, 0, :, 0].tolist() == [1, 2, 3, 4]
    n, got = cache.match(other, limit=4)  # capped: a prompt keeps tokens of its own to compute
    assert n == 4 and got[0, 0, 0, :, 0].tolist() == [1, 2, 3, 9]
    assert cache.match([7, 1])[0] == 0
    assert cache.tokens_held == 8 and cache.bytes_used == 8 * 2 * 2 * 4 * 4
    # where an insert would start asking, read without marking anything used
    lookups, ticks = cache.stats.lookups, {id(n): n.last_used for n in cache._nodes()}
    assert [cache.cached_len(t) for t in ([1, 2, 3, 4, 7], [1, 2, 3, 9, 9, 1], [1, 2], [7])] == [4, 5, 2, 0]
    assert cache.stats.lookups == lookups and {id(n): n.last_used for n in cache._nodes()} == ticks
    longer = [1, 2, 3, 9, 9, 1]
    cache.insert(longer, source(longer))
    assert asked[-1] == (5, 6)


def test_tree_stays_within_its_bytes_evicting_least_recently_used_leaves():
    per_token = kv(1).numel() * 4
    cache = PrefixCache(10 * per_token)
    cache.insert([1, 2, 3, 4], lambda a, b: kv(b - a))
    cache.insert([5, 6, 7, 8], lambda a, b: kv(b - a))
    cache.match([1, 2, 3, 4])  # now [5..8] is the least recently used
    cache.insert([9, 10, 11, 12], lambda a, b: kv(b - a))
    assert cache.bytes_used <= cache.capacity_bytes
    assert cache.match([1, 2, 3, 4])[0] == 4 and cache.match([9, 10, 11, 12])[0] == 4
    assert cache.match([5, 6, 7, 8])[0] == 0 and cache.stats.evicted_tokens == 4
    epoch = cache.epoch
    cache.clear()
    assert cache.bytes_used == 0 and cache.match([1, 2, 3, 4])[0] == 0
    assert cache.insert([1, 2], lambda a, b: kv(b - a), epoch=epoch) == 0  # KV of the old weights
    assert PrefixCache(0).insert([1, 2], lambda a, b: kv(b - a)) == 0
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        PrefixCache(-1)


# ----------------------------------------------------------------------------------- the engine
async def test_greedy_outputs_and_logprobs_equal_with_and_without_the_cache(engines, tiny_tokenizer, tiny_model):
    on, off = engines
    sys_ids = system(tiny_tokenizer)
    prompts = [
        sys_ids + user(tiny_tokenizer, f"You see a {c} ball {i} steps ahead.")
        for i, c in enumerate(["red", "blue", "green", "grey", "purple", "yellow"])
    ]

    async def run(engine):
        first = [await engine.generate(p, GREEDY) for p in prompts[:2]]  # fills the cache one by one

        # a batch mixing fully cached prompts, prompts sharing only the cached system prompt, and
        # requests joining a running batch
        async def late(p, delay):
            await asyncio.sleep(delay)
            return await engine.generate(p, GREEDY)

        mixed = await asyncio.gather(*(late(p, 0.003 * (i % 3)) for i, p in enumerate(prompts)))
        return first + list(mixed)

    with_cache, without = await run(on), await run(off)
    assert_same(with_cache, without)
    stats = on.stats
    assert stats.cached_prompt_tokens > len(sys_ids) * 6  # the system prompt, and whole earlier prompts
    assert stats.prompt_tokens == stats.computed_prompt_tokens + stats.cached_prompt_tokens + stats.shared_prefix_tokens
    assert stats.computed_fraction < off.stats.computed_fraction
    assert on.prefix_cache.stats.hit_tokens >= stats.cached_prompt_tokens


async def test_a_chat_turn_extending_the_previous_one_computes_only_its_new_tokens(engines, tiny_tokenizer):
    on, off = engines
    first_prompt = system(tiny_tokenizer) + user(tiny_tokenizer, "Where is the key?")
    results = {}
    for engine in (on, off):
        first = await engine.generate(first_prompt, GREEDY)
        before = engine.stats.computed_prompt_tokens
        follow_up = user(tiny_tokenizer, "And the door?")
        second_prompt = first_prompt + first.token_ids + follow_up
        second = await engine.generate(second_prompt, GREEDY)
        results[engine] = (first, second, engine.stats.computed_prompt_tokens - before)
    assert_same(results[on][:2], results[off][:2])
    # the prompt and the answer were kept: only the answer's last token (never fed back while
    # decoding) and the new user message are computed
    assert results[on][2] == len(follow_up) + 1
    assert results[off][2] == len(second_prompt)


async def test_concurrent_chats_each_continue_from_their_own_cached_turn(engines, tiny_tokenizer):
    """Rows that finish in the same decode step are kept together (their KV gathered at once):
    each chat's next turn must read its own prompt and answer's KV, never another row's."""
    on, off = engines
    questions = ["Where is the key?", "Is the door locked or open?", "Go", "What colour is the ball next to the wall?"]
    first_prompts = [system(tiny_tokenizer) + user(tiny_tokenizer, q) for q in questions]
    follow_up = user(tiny_tokenizer, "And then?")
    same_length = SamplingParams(temperature=0, max_new_tokens=6)
    results = {}
    for engine in (on, off):
        first = await asyncio.gather(*(engine.generate(p, same_length) for p in first_prompts))
        second_prompts = [p + g.token_ids + follow_up for p, g in zip(first_prompts, first)]
        before = engine.stats.computed_prompt_tokens
        second = await asyncio.gather(*(engine.generate(p, same_length) for p in second_prompts))
        results[engine] = (first + list(second), engine.stats.computed_prompt_tokens - before)
    assert_same(results[on][0], results[off][0])
    # every second turn was served from its own first turn: only its answer's last token and the
    # new user message are computed
    assert results[on][1] == len(questions) * (len(follow_up) + 1)


async def test_a_small_cache_stays_within_its_bytes_and_still_gives_the_same_answers(tiny_model, tiny_tokenizer):
    per_token = (
        2
        * tiny_model.config.num_hidden_layers
        * tiny_model.config.num_key_value_heads
        * (tiny_model.config.hidden_size // tiny_model.config.num_attention_heads)
        * 4
    )
    small = EmbeddedEngine(tiny_model, tiny_tokenizer, prefix_cache_bytes=60 * per_token)
    off = EmbeddedEngine(tiny_model, tiny_tokenizer, prefix_cache_bytes=0)
    prompts = [system(tiny_tokenizer)[: 20 + 7 * i] + user(tiny_tokenizer, f"turn {i}") for i in range(8)] * 2
    try:
        got = []
        for p in prompts:
            got.append(await small.generate(p, GREEDY))
            assert small.prefix_cache.bytes_used <= small.prefix_cache.capacity_bytes
        assert_same(got, [await off.generate(p, GREEDY) for p in prompts])
        assert small.prefix_cache.stats.evicted_tokens > 0
    finally:
        small.close()
        off.close()


async def test_a_weight_update_invalidates_the_cache(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    engine = EmbeddedEngine(model, tiny_tokenizer)
    p = system(tiny_tokenizer) + user(tiny_tokenizer, "go")
    try:
        await engine.generate(p, GREEDY)
        assert engine.prefix_cache.tokens_held > 0
        with engine.weights_lock(), torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        assert engine.prefix_cache.tokens_held == 0
        cached_before = engine.stats.cached_prompt_tokens
        after = await engine.generate(p, GREEDY)
        assert engine.stats.cached_prompt_tokens == cached_before  # nothing stale was served
        fresh = EmbeddedEngine(model, tiny_tokenizer, prefix_cache_bytes=0)
        try:
            assert_same([after], [await fresh.generate(p, GREEDY)])
        finally:
            fresh.close()
    finally:
        engine.close()


async def test_prefix_cache_size_is_checked(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="prefix_cache_bytes must be >= 0"):
        EmbeddedEngine(tiny_model, tiny_tokenizer, prefix_cache_bytes=-1)


def test_rows_of_very_different_lengths_are_prefilled_in_separate_passes():
    from verlog.backends.embedded import _pack_by_length

    assert _pack_by_length([90, 88, 91, 87], overhead=32) == [[2, 0, 1, 3]]  # alike: one pass
    groups = _pack_by_length([142, 24, 36, 119, 30], overhead=32)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert [sorted(g) for g in groups] == [[0, 3], [1, 2, 4]]
    assert _pack_by_length([400] + [20] * 8, overhead=32) == [[0], list(range(1, 9))]
