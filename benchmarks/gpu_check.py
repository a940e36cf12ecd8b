"""make gpu-check: one command that says whether verlog runs on this machine's GPU (<= 10 minutes
on one GPU, no internet beyond the package index).

1. **GPU tests** — ``pytest -m gpu`` (tests/test_gpu.py): the engine's device-side decode step
   against Hugging Face ``generate``, logprobs under bf16 autocast, stops and grammars on the
   device, a bf16 recipe step that moves the weights like float32.
2. **Embedded trainer on CUDA in bf16** — ``configs/babyai_gpu.yaml`` (float32 master weights,
   bf16 autocast) with SmolLM2-135M-Instruct for 2 small updates: the weights move, the losses are
   finite; training tokens/s.
3. **P6** — the embedded engine's turns/s with every request at once against Hugging Face
   ``generate`` one request at a time (same model, prompts, sampling and token budget; target >= 5x).
4. **verl** (where verl and vLLM are installed: ``pip install -e '.[gpu,envs]'``) — the pre-flight
   lines, then ``verlog train --engine verl configs/verl_babyai.yaml`` on one GPU with SmolLM2-135M:
   2 steps with a checkpoint, then the same command to step 3 (verl resumes from the checkpoint).
   Checked: the rollout-vs-training logprob gap (verl's ``training/rollout_probs_diff_*``: the
   actor rescoring the engine's own token ids; a re-tokenized turn shows a large gap), the
   checkpoint folder with verlog's slot counters, the resumed run starting at step 3.

Without CUDA it dry-runs (what CI can do): the GPU tests are collected and skipped with their
reason, the trainer runs the same recipe on the CPU with the tiny model (one update), P6 and the
verl run are skipped (saying so) and the pre-flight lines are printed. Every figure is printed,
then a summary; the exit code is 1 when a part that ran failed.

Usage: python benchmarks/gpu_check.py [--work-dir DIR] [--skip-verl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
NEEDS_CUDA = "skipped (needs CUDA)"


@dataclass
class Part:
    """One part of the check: its status (ok, FAILED, skipped ...) and the figures it measured."""

    name: str
    status: str = "ok"
    figures: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.figures.append(line)
        print(f"  {line}", flush=True)

    def fail(self, why: str) -> None:
        self.status = "FAILED"
        self.note(f"FAILED: {why}")


def header(title: str) -> None:
    print(f"\n== {title}", flush=True)


# ---------------------------------------------------------------------- 1. GPU tests


def gpu_tests(cuda: bool) -> Part:
    header("1. GPU tests (pytest -m gpu)")
    part = Part("GPU tests")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    for line in lines[-8:]:
        part.note(line)
    if out.returncode not in (0, 5):  # 5: nothing collected
        part.fail(f"pytest exited {out.returncode}")
    elif not cuda:
        part.status = NEEDS_CUDA
    return part


# ---------------------------------------------------------------------- 2. the embedded trainer


def embedded_trainer(cuda: bool, work: Path) -> Part:
    header("2. embedded trainer, float32 master weights + bf16 autocast (configs/babyai_gpu.yaml)")
    from safetensors.torch import load_file

    from verlog.config import load_config
    from verlog.models import load_causal_lm
    from verlog.train import train
    from verlog.weights import checkpoint as ckpt

    part = Part("embedded trainer (bf16)")
    run_dir = work / "embedded"
    model = "smollm2" if cuda else "tiny"
    size = (
        ["trainer.num_envs=8", "trainer.turns_per_env=2", "sampling.max_tokens=48"]
        if cuda
        else [
            "trainer.num_envs=4",
            "trainer.turns_per_env=2",
            "sampling.max_tokens=8",
            "algorithm.micro_batch_tokens=4096",
        ]
    )
    overrides = [
        f"model.path={model}",
        f"model.device={'cuda' if cuda else 'cpu'}",
        "model.autocast=bfloat16",
        f"trainer.run_dir={run_dir}",
        f"trainer.total_updates={2 if cuda else 1}",
        "trainer.save_every=1",
        "trainer.eval_every=0",
        "eval.at_start=false",
        "eval.at_end=false",
        "wandb.mode=disabled",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "actor.lr=1.0e-6",
        *size,
    ]
    if not cuda:
        part.note(f"no CUDA: the same recipe on the CPU with the tiny model ({' '.join(overrides[:3])})")
    started = time.perf_counter()
    try:
        config = load_config(ROOT / "configs" / "babyai_gpu.yaml", overrides)
        initial = {k: v.float() for k, v in load_causal_lm(model).state_dict().items()}
        result = train(config)
    except Exception as exc:  # report, go on with the other parts
        part.fail(f"{type(exc).__name__}: {exc}")
        return part
    part.note(
        f"{result.updates} updates in {time.perf_counter() - started:.1f} s ({model}, "
        f"{'cuda' if cuda else 'cpu'}, autocast bfloat16)"
    )
    latest = ckpt.latest_checkpoint(run_dir)
    trained = load_file(next((latest / "actor").glob("*.safetensors")))
    moved = sum(int((trained[k].float() != initial[k]).sum()) for k in trained if k in initial)
    total = sum(initial[k].numel() for k in trained if k in initial)
    part.note(
        f"weights moved: {moved / total:.2%} of the actor's {total:,} weights at lr 1e-6 "
        "(bf16 weights stepped directly: ~0.4% on SmolLM2)"
    )
    if moved / total < 0.5:
        part.fail("the actor's weights barely moved")
    losses = {k: v for row in result.history for k, v in row.items() if "loss" in k}
    part.note("losses: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(losses.items())))
    if not losses or not all(math.isfinite(v) for v in losses.values()):
        part.fail("a loss is not finite (or none was reported)")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    updates = [r for r in rows if "update_s" in r and "prompt_length" in r]
    if updates:
        turns = config.trainer.num_envs * config.trainer.turns_per_env
        rates = [turns * (r["prompt_length"] + r["response_length"]) / r["update_s"] for r in updates]
        part.note(f"training tokens/s (scoring + PPO pass): {sum(rates) / len(rates):,.0f}")
    return part


# ---------------------------------------------------------------------- 3. P6


def engine_speed(device: str | None, requests: int, max_tokens: int) -> Part:
    """P6 on ``device`` (``None``: no CUDA, skipped; ``"cpu"`` only to try the code path)."""
    header("3. P6: embedded engine (all requests at once) vs HF generate (one at a time)")
    part = Part("P6 engine vs HF generate")
    if device is None:
        part.status = NEEDS_CUDA
        part.note("P6 " + NEEDS_CUDA + ": a CPU has no launch overhead for batching to amortize")
        return part
    from verlog.backends.base import SamplingParams
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    model = load_causal_lm("smollm2", device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prompts = [
        tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": f"Game {i}: you see a {['red', 'blue', 'green', 'grey'][i % 4]} key {i % 7} "
                    "steps ahead. Think briefly, then answer with ACTION: <move>.",
                }
            ],
            add_generation_prompt=True,
            tokenize=True,
        )
        for i in range(requests)
    ]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]  # a BatchEncoding or ids
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_tokens)

    async def engine_run(batch):
        engine = EmbeddedEngine(model, tokenizer, max_batch_size=len(batch), autocast=torch.bfloat16)
        try:
            await asyncio.gather(*(engine.generate(p, sampling) for p in batch[:4]))  # warm-up
            sync()
            start = time.perf_counter()
            gens = await asyncio.gather(*(engine.generate(p, sampling) for p in batch))
            return time.perf_counter() - start, sum(len(g.token_ids) for g in gens)
        finally:
            await engine.aclose()

    seconds, tokens = asyncio.run(engine_run(prompts))
    engine_rate = requests / seconds
    part.note(
        f"engine: {requests} requests in {seconds:.2f} s = {engine_rate:.1f} turns/s ({tokens / seconds:,.0f} tokens/s)"
    )
    hf_n = min(16, requests)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16):
        model.generate(torch.tensor([prompts[0]], device=device), do_sample=True, max_new_tokens=4, pad_token_id=pad)
        sync()
        start, hf_tokens = time.perf_counter(), 0
        for p in prompts[:hf_n]:
            out = model.generate(
                torch.tensor([p], device=device),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                pad_token_id=pad,
            )
            hf_tokens += out.shape[1] - len(p)
        sync()
        hf_seconds = time.perf_counter() - start
    hf_rate = hf_n / hf_seconds
    part.note(
        f"HF generate, one at a time: {hf_n} requests in {hf_seconds:.2f} s = {hf_rate:.1f} turns/s "
        f"({hf_tokens / hf_seconds:,.0f} tokens/s)"
    )
    ratio = engine_rate / hf_rate
    part.note(f"P6: {ratio:.1f}x turns/s (target >= 5x) {'OK' if ratio >= 5 else 'MISSED'}")
    if ratio < 5:
        part.status = "MISSED"
    return part


# ---------------------------------------------------------------------- 4. verl


def verl_run(cuda: bool, work: Path) -> Part:
    header("4. verl: pre-flight, then 3 steps on one GPU with SmolLM2-135M (checkpoint at 2, resume to 3)")
    part = Part("verl 3-step run")
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.preflight import has_package, preflight

    config_file = ROOT / "configs" / "verl_babyai.yaml"
    out_dir = work / "verl"
    overrides = [
        "actor_rollout_ref.model.path=smollm2",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "verlog.num_envs=4",
        "verlog.turns_per_env=2",
        "verlog.eval_episodes=4",
        "verlog.critic_warmup.buffer_multiplier=1",
        "verlog.critic_warmup.iterations=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "critic.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
        "critic.ppo_max_token_len_per_gpu=8192",
        "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out_dir / 'checkpoints'}",
        "trainer.experiment_name=gpu_check",
    ]
    try:
        config = compose_verl_config(
            config_file, [o.replace("=smollm2", "=tiny") if not cuda else o for o in overrides]
        )
        findings = preflight(config)
    except Exception as exc:
        part.fail(f"{type(exc).__name__}: {exc}")
        return part
    for finding in findings:
        part.note(f"pre-flight: {'ok' if finding.ok else 'MISSING'}: {finding.line}")
    missing = [f.what for f in findings if not f.ok]
    if not cuda or not has_package("verl"):
        part.status = NEEDS_CUDA if not cuda else "skipped (verl is not installed: pip install -e '.[gpu,envs]')"
        part.note(f"verl run {part.status}")
        return part
    if missing:
        part.status = f"skipped ({', '.join(missing)} missing: see the pre-flight lines)"
        part.note(f"verl run {part.status}")
        return part
    from verlog.integrations.verl.trainer import SLOTS_FILE

    logs = []
    for steps in (2, 3):  # the second command resumes from the checkpoint of step 2
        log = out_dir / f"metrics_to_step{steps}.jsonl"
        env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(log), WANDB_MODE="disabled")
        cmd = [
            sys.executable,
            "-m",
            "verlog.cli",
            "train",
            "--engine",
            "verl",
            str(config_file),
            *overrides,
            f"trainer.total_training_steps={steps}",
        ]
        started = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
        part.note(f"run to step {steps}: exit {out.returncode} in {time.perf_counter() - started:.0f} s")
        if out.returncode != 0:
            tail = (out.stdout + out.stderr).strip().splitlines()[-15:]
            part.fail("verl run failed:\n    " + "\n    ".join(tail))
            return part
        logs.append([json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else [])
    first, resumed = ([r["step"] for r in rows] for rows in logs)
    part.note(f"steps logged: first run {first}, resumed run {resumed}")
    if first[-1:] != [2] or resumed[:1] != [3]:
        part.fail("the second command did not resume at step 3 from the step-2 checkpoint")
    saved = sorted((out_dir / "checkpoints").glob("global_step_*"))
    part.note(
        f"checkpoints: {[p.name for p in saved]}; verlog slot counters: "
        f"{[p.name for p in saved if (p / SLOTS_FILE).exists()]}"
    )
    if not any((p / SLOTS_FILE).exists() for p in saved):
        part.fail(f"no checkpoint holds {SLOTS_FILE}")
    for rows in logs:
        for row in rows:
            data = row["data"]
            gap = data.get("training/rollout_probs_diff_mean")
            if gap is not None:
                part.note(
                    f"step {row['step']}: rollout-vs-training logprob gap mean {gap:.4f}, max "
                    f"{data.get('training/rollout_probs_diff_max', float('nan')):.4f}; "
                    f"turns {data.get('verlog/turns', float('nan')):.0f}"
                )
                if not gap < 0.05:
                    part.fail(
                        f"step {row['step']}: the actor's logprobs of the engine's tokens differ by {gap:.3f} on average"
                    )
    return part


# ---------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="where runs are written (default: a temp dir)")
    parser.add_argument("--skip-verl", action="store_true", help="leave out part 4")
    parser.add_argument("--requests", type=int, default=64, help="P6: requests the engine serves at once")
    parser.add_argument("--max-tokens", type=int, default=64, help="P6: tokens per request")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="verlog-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    started = time.perf_counter()
    if cuda:
        print(
            f"CUDA: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} device(s)), torch {torch.__version__}"
        )
    else:
        print(f"no CUDA device: dry run (torch {torch.__version__}); parts that need CUDA are skipped, saying so")
    parts = [
        gpu_tests(cuda),
        embedded_trainer(cuda, work),
        engine_speed("cuda" if cuda else None, args.requests, args.max_tokens),
    ]
    if not args.skip_verl:
        parts.append(verl_run(cuda, work))
    header(f"summary ({time.perf_counter() - started:.0f} s; work dir {work})")
    for part in parts:
        print(f"  {part.name:28s} {part.status}")
    return 1 if any(p.status == "FAILED" for p in parts) else 0


if __name__ == "__main__":
    sys.exit(main())
