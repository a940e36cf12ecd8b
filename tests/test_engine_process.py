"""The embedded engine in a process of its own (``engine.process``): the same generations as in
process, weights changed here reach it, and a request or a child that fails says so instead of
hanging. A real child process on the tiny model; the in-process engine is the reference."""

from __future__ import annotations

import asyncio
import copy
import os
import signal

import pytest
import torch

from verlog.backends.base import Constraint, EngineError, Generation, InvalidConstraintError, SamplingParams, TokenDelta
from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.engine_process import EngineProcess

PROMPTS = [[5 + i, 10, 20, 30 + i, 40, 50] for i in range(6)]


@pytest.fixture(scope="module")
def model(tiny_dir):
    from verlog.models import load_causal_lm

    return load_causal_lm(tiny_dir)  # its own copy: the tests change its weights


@pytest.fixture(scope="module")
def engines(model, tiny_tokenizer):
    """The engine in a child process and the in-process one, on the same tensors."""
    child = EngineProcess(model, tiny_tokenizer, max_batch_size=8)
    here = EmbeddedEngine(model, tiny_tokenizer, max_batch_size=8)
    yield child, here
    child.close()
    here.close()


async def both(engines, prompts, sampling) -> tuple[list[Generation], list[Generation]]:
    child, here = engines
    return (
        await asyncio.gather(*[child.generate(p, s) for p, s in zip(prompts, sampling)]),
        await asyncio.gather(*[here.generate(p, s) for p, s in zip(prompts, sampling)]),
    )


async def test_seeded_generations_are_the_in_process_engines_token_for_token(engines, tiny_tokenizer):
    stop = tiny_tokenizer.decode([PROMPTS[0][3]])
    sampling = [SamplingParams(max_new_tokens=12, seed=i, temperature=0.8 + 0.1 * i) for i in range(4)] + [
        SamplingParams(max_new_tokens=12, seed=7, stop=(stop,), top_k=5),
        SamplingParams(max_new_tokens=12, seed=8, constraint=Constraint("regex", "(yes|no)( maybe)?")),
    ]
    there, here = await both(engines, PROMPTS, sampling)
    for a, b in zip(there, here):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    assert tiny_tokenizer.decode(there[-1].token_ids, skip_special_tokens=True) in {
        "yes",
        "no",
        "yes maybe",
        "no maybe",
    }
    streamed = [item async for item in engines[0].stream(PROMPTS[0], sampling[0])]
    assert isinstance(streamed[-1], Generation) and streamed[-1].token_ids == here[0].token_ids
    assert [t for d in streamed[:-1] if isinstance(d, TokenDelta) for t in d.token_ids] == here[0].token_ids
    assert engines[0].stats.requests >= len(PROMPTS) + 1  # the child's counters, read through the pipe


async def test_weights_changed_under_its_lock_are_the_ones_it_decodes_with(engines, model):
    child, here = engines
    sampling = [SamplingParams(max_new_tokens=10, seed=3)] * 2
    before, _ = await both(engines, PROMPTS[:2], sampling)  # (their KV now sits in the child's prefix cache)
    saved = copy.deepcopy(model.state_dict())
    try:
        with child.weights_lock(), here.weights_lock(), torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        after, reference = await both(engines, PROMPTS[:2], sampling)
        assert [g.token_ids for g in after] == [g.token_ids for g in reference]
        assert [g.logprobs for g in after] != [g.logprobs for g in before]  # not the cached KV of before
    finally:
        with child.weights_lock(), here.weights_lock():
            model.load_state_dict(saved)


async def test_the_unseeded_stream_is_checkpointed_and_restored_through_the_pipe(engines):
    child, _ = engines
    state = child.sampling_generator.get_state()
    sampling = SamplingParams(max_new_tokens=8)
    first = await child.generate(PROMPTS[0], sampling)
    child.sampling_generator.set_state(state)
    again = await child.generate(PROMPTS[0], sampling)
    assert again.token_ids == first.token_ids


async def test_a_bad_request_fails_alone_and_a_cancelled_one_frees_its_row(engines):
    child, _ = engines
    with pytest.raises(EngineError, match="empty"):
        await child.generate([], SamplingParams())
    with pytest.raises(InvalidConstraintError):
        await asyncio.to_thread(child.validate_constraint, Constraint("regex", "(unclosed"))
    long = asyncio.ensure_future(child.generate(PROMPTS[0], SamplingParams(max_new_tokens=4000, seed=1)))
    await asyncio.sleep(0.2)
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    generated = child.stats.generated_tokens
    done = await asyncio.wait_for(child.generate(PROMPTS[1], SamplingParams(max_new_tokens=5, seed=2)), 60)
    assert len(done.token_ids) <= 5
    await asyncio.sleep(0.5)  # the cancelled row decodes no more
    assert child.stats.generated_tokens - generated <= 5 + 8 * 2


async def test_a_killed_child_fails_the_calls_in_flight_with_its_exit_code(tiny_tokenizer, tiny_dir):
    from verlog.models import load_causal_lm

    engine = EngineProcess(load_causal_lm(tiny_dir), tiny_tokenizer)
    try:
        with engine.weights_lock():  # the child waits at its next step: the call stays in flight
            call = asyncio.ensure_future(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4000)))
            await asyncio.sleep(0.2)
            assert not call.done()
            os.kill(engine._process.pid, signal.SIGKILL)
            with pytest.raises(EngineError, match="exit code -9"):
                await asyncio.wait_for(call, 60)
        with pytest.raises(EngineError):
            await engine.generate(PROMPTS[0], SamplingParams())
    finally:
        engine.close()


def test_training_with_the_engine_in_its_own_process_decodes_with_the_trained_weights(tmp_path):
    """Alternating updates change the actor's shared tensors in place: the child samples with the
    weights each update starts from (the logprobs it records are the learner's, to float error)."""
    from test_overlapped_updates import short_run, update_records

    from verlog.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", *short_run(run_dir, "trainer.total_updates=3", "engine.process=true")]) == 0
    assert main(["train", *short_run(run_dir, "trainer.total_updates=4", "engine.process=true"), "--resume"]) == 0
    records = update_records(run_dir)
    assert [r["update"] for r in records] == [1, 2, 3, 4]
    assert all(r["rollout_logprob_gap"] < 1e-4 for r in records)


def test_too_little_shared_memory_is_said_before_any_process_starts(monkeypatch, tiny_dir):
    """A container's small /dev/shm (Docker gives 64 MiB) is named with the fix, not a bus error."""
    import os as os_module

    from verlog.models import load_causal_lm
    from verlog.weights import shared_memory

    class Tiny:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(os_module, "statvfs", lambda path: Tiny())
    model = load_causal_lm(tiny_dir)
    assert shared_memory.unshared_bytes(model) > 4096
    with pytest.raises(RuntimeError, match=r"engine.process needs \d+ MiB of shared memory.*--shm-size"):
        EngineProcess(model, None)
    assert not any(p.untyped_storage().is_shared() for p in model.parameters())  # nothing moved


async def test_overlapped_updates_publish_into_the_childs_copy_of_the_actor(tiny_tokenizer, tiny_dir):
    """Overlapped updates give the engine its own copy of the actor (``rollout_copy``) and copy the
    trained weights into it when an update ends (``publish_weights``, under the engine's lock): with
    the engine in a process of its own the copy it decodes with is the one they reach."""
    from verlog.models import load_causal_lm
    from verlog.weights.rollout_copy import publish_weights, rollout_copy

    actor = load_causal_lm(tiny_dir)
    child = EngineProcess(rollout_copy(actor), tiny_tokenizer)
    reference = EmbeddedEngine(actor, tiny_tokenizer)
    sampling = SamplingParams(max_new_tokens=10, seed=5)
    try:
        before = await child.generate(PROMPTS[0], sampling)
        with torch.no_grad():  # an update changes the actor, not the engine's copy
            for p in actor.parameters():
                p.mul_(0.5)
        assert (await child.generate(PROMPTS[0], sampling)).logprobs == pytest.approx(before.logprobs, abs=1e-5)
        with child.weights_lock():
            publish_weights(actor, child.model)
        after, expected = await child.generate(PROMPTS[0], sampling), await reference.generate(PROMPTS[0], sampling)
        assert after.token_ids == expected.token_ids and after.logprobs == pytest.approx(expected.logprobs, abs=1e-6)
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    finally:
        child.close()
        reference.close()
