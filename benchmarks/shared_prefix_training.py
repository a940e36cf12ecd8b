"""P9: the training pass with shared prefixes computed once, against the plain pass.

Game prompts repeat a long instruction every turn (BabyAI about 300 tokens, Crafter about 900).
This benchmark builds real turns of both games — each prompt is the agent graph's own
(instruction, one past exchange, current observation) rendered with SmolLM2's chat template,
each response 32 tokens — and runs the trainer's whole pass on them (``score_batch``: old
logprobs, reference logprobs, values; ``ppo_update``: one actor and one critic gradient step),
once with ``algorithm.shared_prefix_min_tokens`` off and once on, each in its own process (so
peak memory is each one's own), interleaved. It prints training tokens/s for both, their ratio
(target: >= 2x), each run's peak resident memory (target: not above P7's 6 GB), and the largest
relative difference between the two runs' updated parameters.

    python benchmarks/shared_prefix_training.py [--turns 8] [--repeats 2]
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
        messages = build_prompt(env.instruction, [(first, "I move.\nACTION: " + env.valid_actions()[0])],
                                step.observation, history_turns=1)
        prompts.append(renderer.render(messages))
        env.close()
    return prompts


def one_run(game: str, share: int, turns: int, threads: int) -> dict:
    """The trainer's pass on ``turns`` turns of ``game`` (in this process); figures as a dict."""
    import torch

    from verlog.config import AlgorithmConfig, LoRAConfig
    from verlog.models import load_tokenizer
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.actor_critic import load_actor, load_critic, load_reference
    from verlog.train.ppo import Learner, ppo_update, score_batch
    from verlog.train.storage import RolloutStorage

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tokenizer = load_tokenizer("smollm2")
    where = {"dtype": "float32", "device": "cpu"}
    actor, _ = load_actor("smollm2", lora=LoRAConfig(), **where)
    critic = load_critic("smollm2", **where)
    reference = load_reference("smollm2", **where)
    g = torch.Generator().manual_seed(0)
    prompts = game_turns(game, turns, tokenizer)
    rows = [[Turn(f"e{i}", 0, p, torch.randint(100, 5000, (32,), generator=g).tolist(), [-1.0] * 32, reward=0.1)]
            for i, p in enumerate(prompts)]
    batch = SlotBatch(rows, [slot[0].prompt_ids for slot in rows], [True] * turns, [[0]] * turns)
    # the token budget of P7's memory benchmark: a pass's activations stay within its 6 GB
    algo = AlgorithmConfig(mini_batch_turns=turns, micro_batch_tokens=2048, kl_coef=0.001,
                           shared_prefix_min_tokens=share)
    learner = Learner(actor, critic, torch.optim.SGD(actor.parameters(), lr=1e-3),
                      torch.optim.SGD(critic.parameters(), lr=1e-3), reference, algo, pad_id=0,
                      device=torch.device("cpu"))
    storage = RolloutStorage.from_batch(batch)
    tokens = sum(len(s) for s in storage.sequences)
    started = time.perf_counter()
    score_batch(storage, learner)
    ppo_update(storage, learner, generator=torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - started
    probe = torch.cat([p.detach().flatten()[:4096] for p in actor.parameters()])
    return {
        "game": game, "share": share, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
        "prompt_tokens_mean": sum(len(p) for p in prompts) / len(prompts),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "probe": probe.tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--games", default="babyai:goto,crafter")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--one", nargs=2, metavar=("GAME", "SHARE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one[0], int(args.one[1]), args.turns, args.threads)))
        return
    from verlog.models import smollm2_dir

    smollm2_dir()  # build the offline model once, outside the timed runs
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for game in args.games.split(","):
            for share in (0, 32):  # interleaved: machine noise hits both alike
                out = subprocess.run(
                    [sys.executable, __file__, "--one", game, str(share), "--turns", str(args.turns),
                     "--threads", str(args.threads)],
                    check=True, capture_output=True, text=True,
                ).stdout.strip().splitlines()[-1]
                run = json.loads(out)
                results.setdefault((game, share), []).append(run)
                print(f"  run: {game} {'shared' if share else 'plain '}: {run['tokens_per_s']:.1f} tokens/s "
                      f"({run['seconds']:.0f} s), peak RSS {run['peak_rss_gb']:.2f} GB", flush=True)
    print(f"SmolLM2-135M, fp32, {args.turns} turns a pass (32 response tokens each), actor + critic + reference")
    for game in args.games.split(","):
        plain, shared = results[(game, 0)], results[(game, 32)]
        best = lambda runs: max(r["tokens_per_s"] for r in runs)  # noqa: E731
        drift = max(
            abs(a - b) / max(abs(a), 1e-8) for a, b in zip(plain[0]["probe"], shared[0]["probe"])
        )
        ratio = best(shared) / best(plain)
        print(f"{game}: prompts of {plain[0]['prompt_tokens_mean']:.0f} tokens on average")
        print(f"  plain pass   : {best(plain):7.1f} tokens/s, peak RSS {max(r['peak_rss_gb'] for r in plain):.2f} GB")
        print(f"  shared prefix: {best(shared):7.1f} tokens/s, peak RSS {max(r['peak_rss_gb'] for r in shared):.2f} GB")
        print(f"  ratio {ratio:.2f}x (target >= 2x) {'OK' if ratio >= 2 else 'MISSED'}; "
              f"largest relative difference of updated parameters {drift:.1e}")


if __name__ == "__main__":
    main()
