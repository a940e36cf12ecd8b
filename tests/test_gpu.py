"""On a CUDA device: the embedded engine's device-side decode step and the bf16 training recipe.

Marked ``gpu`` (``pytest -m gpu`` runs them alone; ``make gpu-check`` does). Without CUDA each test
is skipped, saying so; the last test (not marked) dry-runs ``benchmarks/gpu_check.py`` on the CPU.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verlog.backends.base import Constraint, SamplingParams
from verlog.backends.embedded import EmbeddedEngine

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False here); make gpu-check runs it on a GPU machine"
gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
CUDA = torch.device("cuda")


def _apply(marks):
    def wrap(fn):
        for mark in reversed(marks):
            fn = mark(fn)
        return fn

    return wrap


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer(
            f"game {i}: the agent walks to the {['red', 'blue', 'green'][i % 3]} door and", add_special_tokens=False
        )["input_ids"]
        for i in range(n)
    ]


@pytest.fixture
def cuda_model(tiny_model):
    return copy.deepcopy(tiny_model).to(CUDA)


@_apply(gpu)
def test_greedy_engine_on_cuda_equals_hf_generate(cuda_model, tiny_tokenizer):
    """Greedy decoding on the device gives Hugging Face ``generate``'s tokens (one request at a time,
    as HF runs: batched kernels may break near-ties of a random model differently; the CPU tests
    show batching never changes a request's tokens)."""
    engine = EmbeddedEngine(cuda_model, tiny_tokenizer)
    batch = prompts(tiny_tokenizer, 8)
    gens = [asyncio.run(_gather(engine, [p], SamplingParams(temperature=0, max_new_tokens=12)))[0] for p in batch]
    engine.close()
    for p, g in zip(batch, gens):
        with torch.inference_mode():
            out = cuda_model.generate(
                torch.tensor([p], device=CUDA),
                do_sample=False,
                max_new_tokens=12,
                pad_token_id=tiny_tokenizer.pad_token_id or 0,
            )
        expected = out[0, len(p) :].tolist()
        assert g.token_ids == expected[: len(g.token_ids)]


@_apply(gpu)
def test_sampled_logprobs_under_bf16_autocast_match_a_teacher_forced_pass_on_cuda(cuda_model, tiny_tokenizer):
    engine = EmbeddedEngine(cuda_model, tiny_tokenizer, autocast=torch.bfloat16)
    batch = prompts(tiny_tokenizer, 6)
    gens = asyncio.run(_gather(engine, batch, SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=5)))
    again = asyncio.run(
        _gather(engine, batch[:1], SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=5))
    )
    engine.close()
    assert again[0].token_ids == gens[0].token_ids  # a seeded request's stream is its own, batched or alone
    for p, g in zip(batch, gens):
        ids = torch.tensor([p + g.token_ids], device=CUDA)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            logits = cuda_model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
        forced = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(g.token_ids, device=CUDA)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(g.logprobs), forced.cpu(), atol=0.05)


@_apply(gpu)
def test_stop_strings_and_grammars_on_cuda(cuda_model, tiny_tokenizer):
    """A stop string (the device table) cuts the greedy answer right after it; a grammar (masks
    unpacked on the device) gives JSON its schema accepts."""
    import json

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    p = prompts(tiny_tokenizer, 1)[0]
    engine = EmbeddedEngine(cuda_model, tiny_tokenizer)
    free = asyncio.run(_gather(engine, [p], SamplingParams(temperature=0, max_new_tokens=20)))[0]
    stop = tiny_tokenizer.decode(free.token_ids)[-4:-1]
    cut = asyncio.run(_gather(engine, [p], SamplingParams(temperature=0, max_new_tokens=20, stop=(stop,))))[0]
    assert cut.finish_reason == "stop" and stop in tiny_tokenizer.decode(cut.token_ids)
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < len(free.token_ids)
    shaped = asyncio.run(
        _gather(
            engine,
            [p] * 3,
            SamplingParams(temperature=1.0, max_new_tokens=60, seed=2, constraint=Constraint.json_schema(schema)),
        )
    )
    engine.close()
    for g in shaped:
        if g.finish_reason == "stop":
            assert isinstance(json.loads(tiny_tokenizer.decode(g.token_ids[:-1]))["a"], int)


@_apply(gpu)
def test_a_bf16_recipe_step_on_cuda_moves_the_weights_like_float32(tiny_model):
    from test_precision import moved_fraction, one_recipe_step, update_cosine

    fp32 = one_recipe_step(tiny_model, weights=torch.float32, compute=None, device=CUDA)
    mixed = one_recipe_step(tiny_model, weights=torch.float32, compute=torch.bfloat16, device=CUDA)
    assert moved_fraction(*mixed[:2]) > 0.99
    assert update_cosine(mixed[:2], fp32[:2]) > 0.9
    assert all(torch.isfinite(torch.tensor(v)) for k, v in mixed[2].items() if "loss" in k)


async def _gather(engine, batch, sampling):
    return await asyncio.gather(*(engine.generate(p, sampling) for p in batch))


def test_gpu_check_dry_runs_on_the_cpu(tmp_path):
    """``make gpu-check`` without CUDA: what can run runs at toy size, the rest says why it is skipped."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: make gpu-check runs for real")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--work-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "no CUDA device: dry run" in text
    assert "skipped (needs CUDA)" in text and "P6" in text
    assert "embedded trainer" in text and "weights moved" in text
    assert "pre-flight" in text and "GPUs:" in text
