"""P6 on a model of a real size: the embedded engine's decode throughput against transformers' own
``generate``, and one PPO update's training throughput and peak GPU memory.

The model is random-init, built from the configuration of a real one (no download): Qwen2.5-0.5B
(494M parameters, 151,936-token vocabulary) or SmolLM2-360M. Random weights decode and train at the
speed trained ones do (the same matrices); their tokens are noise, so a response may end early on an
end token: every figure counts the tokens actually produced.

* ``decode`` (P6): batches of 1, 32 and 128 prompts of 512 random tokens, 128 new tokens each, sampled
  at temperature 1. The engine takes the batch's requests at once (``max_batch_size`` = the batch);
  ``generate`` takes the same prompts as one batch. Both in float32 weights under bf16 autocast (the
  recipe's, ``configs/babyai_gpu.yaml``). Prints tokens/s of each and the engine's ratio.
* ``train``: one PPO update as the trainer runs it (``score_batch``: the actor's, the reference's and
  the critic's passes; ``ppo_update``: one actor and one critic step) with ``configs/babyai_gpu.yaml``'s
  settings (float32 master weights, bf16 autocast, gradient checkpointing, KL to the reference), on
  32 turns of 512 prompt + 128 response tokens; then the same with ``train_layers`` (the last 4 blocks
  of the actor and of the critic). Each setting runs in a process of its own. Prints tokens/s
  (the batch's tokens over the update's seconds) and the peak GPU memory.

``--dry-run`` runs both on the CPU with a 2-layer model of the same architecture and tiny sizes (a
check of the code path, not a measurement). ``--json FILE`` writes the figures.

    python benchmarks/gpu_throughput.py decode [--model qwen2.5-0.5b] [--batches 1,32,128] [--json FILE]
    python benchmarks/gpu_throughput.py train [--model smollm2-360m] [--train-layers 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the configurations of the real models (their config.json files' sizes): (model type, fields)
MODELS: dict[str, tuple[str, dict]] = {
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
        ),
    ),
    "smollm2-360m": (
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=960,
            intermediate_size=2560,
            num_hidden_layers=32,
            num_attention_heads=15,
            num_key_value_heads=5,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100_000.0,
            tie_word_embeddings=True,
        ),
    ),
}
#: what ``--dry-run`` shrinks a configuration to
DRY_SIZES = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
RECIPE = ROOT / "configs" / "babyai_gpu.yaml"


def build_model(name: str, device: str, *, dry_run: bool):
    """A random-init causal LM of ``name``'s configuration (float32 weights) on ``device``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = MODELS[name]
    fields = dict(fields, **(DRY_SIZES | {"vocab_size": 1024} if dry_run else {}))
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def tokenizer_for(model):
    """The tiny offline model's tokenizer, its end token made the model's: the engine needs one for
    its end and padding ids (the prompts are ids; nothing is decoded)."""
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return tokenizer


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n, length), generator=g).tolist()


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def engine_tokens_per_s(model, tokenizer, prompts: list[list[int]], new_tokens: int, device: str) -> dict:
    """The embedded engine serving ``prompts`` at once: tokens/s of the new tokens."""
    import torch

    from verlog.backends.base import SamplingParams
    from verlog.backends.embedded import EmbeddedEngine

    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=None)

    async def run() -> tuple[float, int]:
        engine = EmbeddedEngine(model, tokenizer, max_batch_size=len(prompts), autocast=torch.bfloat16)
        try:
            await engine.generate(prompts[0][:16], SamplingParams(max_new_tokens=4))  # warm-up
            sync(device)
            start = time.perf_counter()
            gens = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            sync(device)
            return time.perf_counter() - start, sum(len(g.token_ids) for g in gens)
        finally:
            await engine.aclose()

    seconds, tokens = asyncio.run(run())
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def generate_tokens_per_s(model, tokenizer, prompts: list[list[int]], new_tokens: int, device: str) -> dict:
    """transformers' ``generate`` on ``prompts`` as one batch: tokens/s of the new tokens (a row's
    tokens up to its end token)."""
    import torch

    eos = tokenizer.eos_token_id
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16):
        model.generate(ids[:1, :16], do_sample=True, max_new_tokens=4, pad_token_id=eos)  # warm-up
        sync(device)
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        sync(device)
        seconds = time.perf_counter() - start
    new = out[:, ids.shape[1] :]
    ended = (new == eos).int()
    # a row's tokens: up to and including its first end token (generate pads the rest)
    lengths = torch.where(ended.any(1), ended.argmax(1) + 1, torch.full_like(ended[:, 0], new.shape[1]))
    tokens = int(lengths.sum())
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def decode(args: argparse.Namespace) -> dict:
    import torch

    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    model = build_model(args.model, device, dry_run=args.dry_run)
    tokenizer = tokenizer_for(model)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"P6: {args.model}{' (dry run: 2 layers)' if args.dry_run else ''}, {params / 1e6:,.1f}M parameters, "
        f"random-init, float32 weights under bf16 autocast, on {device}; prompts of {args.prompt_tokens} "
        f"tokens, {args.new_tokens} new tokens, temperature 1",
        flush=True,
    )
    rows = []
    for batch in args.batches:
        prompts = random_prompts(batch, args.prompt_tokens, model.config.vocab_size, seed=batch)
        engine = engine_tokens_per_s(model, tokenizer, prompts, args.new_tokens, device)
        hf = generate_tokens_per_s(model, tokenizer, prompts, args.new_tokens, device)
        row = {"batch": batch, "engine": engine, "generate": hf, "ratio": engine["tokens_per_s"] / hf["tokens_per_s"]}
        rows.append(row)
        print(
            f"  batch {batch:4d}: engine {engine['tokens_per_s']:9,.0f} tokens/s ({engine['tokens']} in "
            f"{engine['seconds']:.2f} s), generate {hf['tokens_per_s']:9,.0f} tokens/s ({hf['tokens']} in "
            f"{hf['seconds']:.2f} s): {row['ratio']:.2f}x",
            flush=True,
        )
    return {
        "model": args.model,
        "parameters": params,
        "device": device,
        "dry_run": args.dry_run,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "batches": rows,
    }


def train_once(args: argparse.Namespace, train_layers: int | None) -> dict:
    """One PPO update (this process): tokens/s and peak GPU memory."""
    import torch

    from verlog.config import load_config
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.ppo import ppo_update, score_batch
    from verlog.train.storage import RolloutStorage
    from verlog.train.trainer import _learner
    from verlog.weights.precision import autocast_dtype

    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    with tempfile.TemporaryDirectory(prefix="verlog-gpu-throughput-") as folder:
        model = build_model(args.model, "cpu", dry_run=args.dry_run)
        tokenizer = tokenizer_for(model)
        model.save_pretrained(folder)  # the trainer loads its models from a folder
        vocab = model.config.vocab_size
        del model
        layers = (
            []
            if train_layers is None
            else [f"actor.train_layers={train_layers}", f"critic.train_layers={train_layers}"]
        )
        config = load_config(
            RECIPE,
            [
                f"model.path={folder}",
                f"model.device={device}",
                f"algorithm.mini_batch_turns={args.turns}",
                "wandb.mode=disabled",
                *layers,
            ],
        )
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        learner, _ = _learner(config, None, tokenizer, torch.device(device), autocast_dtype(config.model.autocast))
    prompts = random_prompts(args.turns, args.prompt_tokens, vocab, seed=1)
    responses = random_prompts(args.turns, args.response_tokens, vocab, seed=2)
    rows = [
        [Turn(f"e{i}", 0, p, r, [-1.0] * len(r), reward=float(i % 2))]
        for i, (p, r) in enumerate(zip(prompts, responses))
    ]
    batch = SlotBatch(rows, [slot[0].prompt_ids for slot in rows], [True] * args.turns, [[0]] * args.turns)
    storage = RolloutStorage.from_batch(batch)
    sync(device)
    start = time.perf_counter()
    metrics = score_batch(storage, learner)
    metrics |= ppo_update(storage, learner, generator=torch.Generator().manual_seed(0))
    sync(device)
    seconds = time.perf_counter() - start
    tokens = sum(len(s) for s in storage.sequences)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {
        "train_layers": train_layers,
        "device": device,
        "turns": args.turns,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "peak_gpu_bytes": peak,
        "losses_finite": all(v == v and abs(v) != float("inf") for k, v in metrics.items() if "loss" in k),
        "phases_s": {k: v for k, v in metrics.items() if k.endswith("_s")},
    }


def train(args: argparse.Namespace) -> dict:
    settings = [None, args.train_layers]
    runs = []
    print(
        f"one PPO update of {args.model}{' (dry run: 2 layers)' if args.dry_run else ''} (actor, critic, "
        f"reference), configs/babyai_gpu.yaml's recipe: float32 master weights, bf16 autocast; "
        f"{args.turns} turns of {args.prompt_tokens} + {args.response_tokens} tokens",
        flush=True,
    )
    for layers in settings:
        cmd = [sys.executable, __file__, "train", "--one", str(layers or 0), *_shared_flags(args)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=_pythonpath()))
        if out.returncode != 0:
            print(out.stdout + out.stderr, flush=True)
            raise SystemExit(f"error: the update with train_layers {layers} failed (exit {out.returncode})")
        run = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(run)
        peak = run["peak_gpu_bytes"]
        print(
            f"  train_layers {str(layers or 'all'):>3}: {run['tokens_per_s']:9,.0f} tokens/s ({run['tokens']} tokens in "
            f"{run['seconds']:.2f} s), peak GPU memory {'n/a (CPU)' if peak is None else f'{peak / 2**30:.2f} GiB'}, "
            f"losses {'finite' if run['losses_finite'] else 'NOT FINITE'}",
            flush=True,
        )
    return {"model": args.model, "dry_run": args.dry_run, "runs": runs}


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def _shared_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--model", args.model, "--turns", str(args.turns), "--prompt-tokens", str(args.prompt_tokens)]
    flags += ["--response-tokens", str(args.response_tokens)]
    return flags + (["--dry-run"] if args.dry_run else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("decode", "train"))
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, a 2-layer model, tiny sizes")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--batches", default=None, help="decode: batch sizes (default 1,32,128; dry run 1,2)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default 512 (dry run 16)")
    parser.add_argument("--new-tokens", type=int, default=None, help="decode: default 128 (dry run 8)")
    parser.add_argument("--turns", type=int, default=None, help="train: default 32 (dry run 4)")
    parser.add_argument("--response-tokens", type=int, default=None, help="train: default 128 (dry run 8)")
    parser.add_argument("--train-layers", type=int, default=4, help="train: the second setting's train_layers")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dry = args.dry_run
    args.batches = [int(b) for b in (args.batches or ("1,2" if dry else "1,32,128")).split(",")]
    args.prompt_tokens = args.prompt_tokens or (16 if dry else 512)
    args.new_tokens = args.new_tokens or (8 if dry else 128)
    args.turns = args.turns or (4 if dry else 32)
    args.response_tokens = args.response_tokens or (8 if dry else 128)
    if dry:
        args.train_layers = min(args.train_layers, DRY_SIZES["num_hidden_layers"] - 1)
    if args.one is not None:  # one training setting, in this process (run by `train`)
        print(json.dumps(train_once(args, args.one or None)))
        return 0
    figures = decode(args) if args.what == "decode" else train(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
