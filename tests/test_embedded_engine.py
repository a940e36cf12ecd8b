"""The embedded engine: batching never changes what a request gets, and every stop rule holds."""

from __future__ import annotations

import asyncio

import pytest
import torch

from verlog.backends.base import EngineError, SamplingParams
from verlog.backends.embedded import EmbeddedEngine

SYSTEM = "<|im_start|>system\nYou play a game on a grid. Valid actions: turn left, turn right, go forward.<|im_end|>\n"


def prompt(tokenizer, text: str, system: str = SYSTEM) -> list[int]:
    return tokenizer(f"{system}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]


@pytest.fixture()
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, max_batch_size=8)
    yield engine
    engine.close()


def teacher_forced(lm, prompt_ids, ids) -> torch.Tensor:
    with torch.inference_mode():
        logp = torch.log_softmax(lm(torch.tensor([prompt_ids + ids])).logits[0].float(), -1)
    p = len(prompt_ids)
    return logp[p - 1 : p - 1 + len(ids)].gather(1, torch.tensor(ids)[:, None])[:, 0]


@pytest.mark.parametrize("cache_bytes", [0, 64 << 20], ids=["no-prefix-cache", "prefix-cache"])
async def test_greedy_is_the_same_alone_and_in_any_batch(cache_bytes, tiny_tokenizer, tiny_model):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, max_batch_size=8, prefix_cache_bytes=cache_bytes)
    prompts = [prompt(tiny_tokenizer, "hello " * i) for i in range(1, 11)]  # shared prefix, ragged tails
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    alone = [await engine.generate(p, greedy) for p in prompts[:3]]

    async def late(p, delay):  # join a running batch mid-flight (cache merge path)
        await asyncio.sleep(delay)
        return await engine.generate(p, greedy)

    together = await asyncio.gather(*(late(p, 0.002 * i) for i, p in enumerate(prompts)))
    reused = engine.stats.cached_prompt_tokens if cache_bytes else engine.stats.shared_prefix_tokens
    assert reused > 0 and engine.stats.mean_batch_size > 1
    for a, b in zip(alone, together[:3]):
        assert a.token_ids == b.token_ids
    for p, gen in zip(prompts, together):  # more requests than max_batch_size: backlog path too
        assert torch.allclose(teacher_forced(tiny_model, p, gen.token_ids), torch.tensor(gen.logprobs), atol=1e-3)
    engine.close()


async def test_sampled_logprobs_match_a_teacher_forced_pass(engine, tiny_tokenizer, tiny_model):
    prompts = [prompt(tiny_tokenizer, f"step {i}") for i in range(6)]
    gens = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=i))
            for i, p in enumerate(prompts)
        )
    )
    for p, gen in zip(prompts, gens):
        lm_logits = None
        with torch.inference_mode():
            lm_logits = tiny_model(torch.tensor([p + gen.token_ids])).logits[0].float()
        logp = torch.log_softmax(lm_logits / 0.7, -1)[len(p) - 1 : len(p) - 1 + len(gen.token_ids)]
        forced = logp.gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        assert torch.allclose(forced, torch.tensor(gen.logprobs), atol=1e-3)


async def test_seeded_sampling_is_reproducible(engine, tiny_tokenizer):
    p = prompt(tiny_tokenizer, "roll")
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=123)
    first = await engine.generate(p, params)
    others = await asyncio.gather(engine.generate(p, params), engine.generate(p, SamplingParams(max_new_tokens=10)))
    assert first.token_ids == others[0].token_ids


async def test_stop_rules(engine, tiny_tokenizer):
    p = prompt(tiny_tokenizer, "count")
    free = await engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20))
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    # a stop token id: generation ends right after it (the id is kept)
    stop_id = free.token_ids[5]
    cut = await engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=(stop_id,)))
    assert cut.finish_reason == "stop" and cut.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]
    # a stop string: ends after the token that completes it
    text = tiny_tokenizer.decode(free.token_ids[:8])
    stop = text[-3:]
    by_text = await engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20, stop=(stop,)))
    assert by_text.finish_reason == "stop" and stop in tiny_tokenizer.decode(by_text.token_ids)
    assert len(by_text.token_ids) <= 8
    # top_k = 1 is greedy
    top1 = await engine.generate(p, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=20))
    assert top1.token_ids == free.token_ids


async def test_bad_requests_and_failures_keep_the_engine_serving(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, max_context=64)
    with pytest.raises(EngineError, match="leaves no room to generate within the engine's max_context of 64"):
        await engine.generate(list(range(3, 70)), SamplingParams())
    with pytest.raises(EngineError, match="empty"):
        await engine.generate([], SamplingParams())
    p = prompt(tiny_tokenizer, "x", system="")
    near_limit = await engine.generate(p, SamplingParams(max_new_tokens=500))  # capped by the context
    assert near_limit.finish_reason in ("length", "stop") and len(p) + len(near_limit.token_ids) <= 64

    real_forward = engine.model.forward
    engine.model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost"))
    with pytest.raises(EngineError, match="device lost"):
        await engine.generate(p, SamplingParams(max_new_tokens=4))
    engine.model.forward = real_forward
    assert (await engine.generate(p, SamplingParams(max_new_tokens=4))).token_ids
    engine.close()
    with pytest.raises(EngineError, match="closed"):
        await engine.generate(p, SamplingParams())


async def test_broken_weights_fail_the_request_with_their_cause(tiny_model, tiny_tokenizer):
    """Logits that are NaN (weights a diverged update broke) fail each request, sampled or greedy,
    with an error that says so (not an index error from the sampler), and the engine serves on."""
    import copy

    model = copy.deepcopy(tiny_model)
    engine = EmbeddedEngine(model, tiny_tokenizer, max_batch_size=8)
    try:
        p = prompt(tiny_tokenizer, "x")
        head = model.get_output_embeddings().weight
        kept = head.detach().clone()
        with engine.weights_lock(), torch.no_grad():
            head.fill_(float("nan"))
        for temperature in (1.0, 0.0):
            with pytest.raises(EngineError, match="logits are not finite"):
                await engine.generate(p, SamplingParams(temperature=temperature, max_new_tokens=4, seed=1))
        with engine.weights_lock(), torch.no_grad():  # (as a trainer changes them: the prefix cache is cleared)
            head.copy_(kept)
        assert (await engine.generate(p, SamplingParams(max_new_tokens=4))).token_ids
    finally:
        engine.close()
