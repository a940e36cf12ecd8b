"""P9: the training pass with shared prefixes computed once, against the plain pass.

Game prompts repeat a long instruction every turn (BabyAI about 300 tokens, Crafter about 900).
This benchmark builds real turns of both games — each prompt is the agent graph's own
(instruction, one past exchange, current observation) rendered with SmolLM2's chat template,
each response 32 tokens — and runs the trainer's whole pass on them (``score_batch``: old
logprobs, reference logprobs, values; ``ppo_update``: one actor and one critic gradient step),
once with ``algorithm.shared_prefix_min_tokens`` off and once on, each in its own process (so
peak memory is each one's own), interleaved. The settings are P7's (``train_memory.py``): full
fine-tuning in fp32 with AdamW, gradient checkpointing (a pass keeps each layer's inputs only), with
a 4096-token micro-batch budget by default (P7 uses 2048; the peaks printed here say what the
larger budget costs, and a budget counts a shared prefix once, so more rows share it). It prints
training tokens/s for both, their ratio (target: >= 2x), each run's peak resident memory (target:
not above P7's 6 GB), and how far the two runs' parameter updates differ (norm of the difference
over norm: Adam's first step moves each parameter by about ``lr * sign(gradient)``, so a gradient
element near zero may flip with float rounding and an element-wise comparison would show that
rounding, not a difference of the passes).

    python benchmarks/shared_prefix_training.py [--turns 8] [--repeats 2] [--no-checkpointing]
                                                [--micro-batch-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def game_turns(game: str, turns: int, tokenizer, response_tokens: int = 32) -> list[list[int]]:
    """``turns`` prompts of ``game`` as its agent graph renders them (seeds 0, 1, ...)."""
    from verlog.envs import make_env
    from verlog.envs.agent_graph import build_prompt
    from verlog.llm.prompt import PromptRenderer

    renderer = PromptRenderer(tokenizer)
    prompts = []
    for seed in range(turns):
        env = make_env(game)
        first = env.reset(seed)
        step = env.step("ACTION: " + env.valid_actions()[0])
        messages = build_prompt(
            env.instruction, [(first, "I move.\nACTION: " + env.valid_actions()[0])], step.observation, history_turns=1
        )
        prompts.append(renderer.render(messages))
        env.close()
    return prompts


def one_run(
    game: str, share: int, turns: int, threads: int, checkpointing: bool = True, micro_batch_tokens: int = 4096
) -> dict:
    """The trainer's pass on ``turns`` turns of ``game`` (in this process); figures as a dict."""
    import torch

    from verlog.config import AlgorithmConfig, LoRAConfig
    from verlog.models import load_tokenizer
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.ppo import Learner, adamw, ppo_update, score_batch
    from verlog.train.storage import RolloutStorage
    from verlog.weights.actor_critic import load_actor, load_critic, load_reference

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tokenizer = load_tokenizer("smollm2")
    where = {"dtype": "float32", "device": "cpu"}
    actor, _ = load_actor("smollm2", lora=LoRAConfig(), **where)
    critic = load_critic("smollm2", **where)
    reference = load_reference("smollm2", **where)
    if checkpointing:
        actor.gradient_checkpointing_enable()
        critic.gradient_checkpointing_enable()
    g = torch.Generator().manual_seed(0)
    prompts = game_turns(game, turns, tokenizer)
    rows = [
        [Turn(f"e{i}", 0, p, torch.randint(100, 5000, (32,), generator=g).tolist(), [-1.0] * 32, reward=0.1)]
        for i, p in enumerate(prompts)
    ]
    batch = SlotBatch(rows, [slot[0].prompt_ids for slot in rows], [True] * turns, [[0]] * turns)
    algo = AlgorithmConfig(
        mini_batch_turns=turns, micro_batch_tokens=micro_batch_tokens, kl_coef=0.001, shared_prefix_min_tokens=share
    )
    adam = dict(betas=(0.9, 0.999), weight_decay=0.0)
    learner = Learner(
        actor,
        critic,
        adamw(actor, SimpleNamespace(lr=1e-5, **adam)),
        adamw(critic, SimpleNamespace(lr=1e-4, **adam)),
        reference,
        algo,
        pad_id=0,
        device=torch.device("cpu"),
    )
    storage = RolloutStorage.from_batch(batch)
    tokens = sum(len(s) for s in storage.sequences)
    before = torch.cat([p.detach().flatten()[:4096] for p in actor.parameters()])
    started, cpu_started = time.perf_counter(), time.process_time()
    score_batch(storage, learner)
    scored = time.perf_counter()
    ppo_update(storage, learner, generator=torch.Generator().manual_seed(0))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    # the update itself (a slice of every parameter): compared between the two runs
    probe = torch.cat([p.detach().flatten()[:4096] for p in actor.parameters()]) - before
    return {
        "game": game,
        "share": share,
        "tokens": tokens,
        "seconds": seconds,
        "score_seconds": scored - started,
        "tokens_per_s": tokens / seconds,
        "tokens_per_cpu_s": tokens / cpu_seconds,
        "prompt_tokens_mean": sum(len(p) for p in prompts) / len(prompts),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "probe": probe.tolist(),
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--games", default="babyai:goto,crafter")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every activation (more memory)")
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--one", nargs=2, metavar=("GAME", "SHARE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(
            json.dumps(
                one_run(
                    args.one[0],
                    int(args.one[1]),
                    args.turns,
                    args.threads,
                    not args.no_checkpointing,
                    args.micro_batch_tokens,
                )
            )
        )
        return
    from verlog.models import smollm2_dir

    smollm2_dir()  # build the offline model once, outside the timed runs
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for game in args.games.split(","):
            for share in (0, 32):  # interleaved: machine noise hits both alike
                out = (
                    subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--one",
                            game,
                            str(share),
                            "--turns",
                            str(args.turns),
                            "--threads",
                            str(args.threads),
                            "--micro-batch-tokens",
                            str(args.micro_batch_tokens),
                            *(["--no-checkpointing"] if args.no_checkpointing else []),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                run = json.loads(out)
                results.setdefault((game, share), []).append(run)
                print(
                    f"  run: {game} {'shared' if share else 'plain '}: {run['tokens_per_s']:.1f} tokens/s, "
                    f"{run['tokens_per_cpu_s']:.1f} per CPU second ({run['seconds']:.0f} s, scoring "
                    f"{run['score_seconds']:.0f} s), peak RSS {run['peak_rss_gb']:.2f} GB",
                    flush=True,
                )
    how = "every activation kept" if args.no_checkpointing else "gradient checkpointing"
    print(
        f"SmolLM2-135M, fp32, AdamW, {how}, {args.turns} turns a pass (32 response tokens each), "
        f"micro-batches of {args.micro_batch_tokens} tokens, actor + critic + reference"
    )
    for game in args.games.split(","):
        plain, shared = results[(game, 0)], results[(game, 32)]
        best = lambda runs, key="tokens_per_s": max(r[key] for r in runs)  # noqa: E731
        a, b = (torch.tensor(runs[0]["probe"], dtype=torch.float64) for runs in (plain, shared))
        drift = float((a - b).norm() / a.norm().clamp(min=1e-30))
        ratio = best(shared) / best(plain)
        cpu_ratio = best(shared, "tokens_per_cpu_s") / best(plain, "tokens_per_cpu_s")
        print(f"{game}: prompts of {plain[0]['prompt_tokens_mean']:.0f} tokens on average")
        for name, runs in (("plain pass   ", plain), ("shared prefix", shared)):
            print(
                f"  {name}: {best(runs):7.1f} tokens/s ({best(runs, 'tokens_per_cpu_s'):.1f} per CPU second), "
                f"peak RSS {max(r['peak_rss_gb'] for r in runs):.2f} GB"
            )
        print(
            f"  ratio {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU time (target >= 2x) "
            f"{'OK' if ratio >= 2 else 'MISSED'}; "
            f"parameter updates differ by {drift:.1e} (relative norm)"
        )


if __name__ == "__main__":
    main()
