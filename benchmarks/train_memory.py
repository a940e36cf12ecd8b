"""P7: peak memory of CPU training with SmolLM2-135M as actor and critic.

Full fine-tuning in fp32 with AdamW, plus the frozen reference policy for KL-in-reward: the
trainer's own scoring and PPO passes (``score_batch``, ``ppo_update``) on a batch of 8 turns of
550 prompt + 32 response tokens, three updates. Prints the resident set after each phase and the
peak, against the target (<= 6 GB) and the floor (16 bytes per parameter for each trained model,
4 for the reference).

    python benchmarks/train_memory.py [--no-checkpointing] [--micro-batch-tokens 2048]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verlog.config import AlgorithmConfig, LoRAConfig  # noqa: E402
from verlog.rollout.slots import SlotBatch  # noqa: E402
from verlog.rollout.turn import Turn  # noqa: E402
from verlog.train.ppo import Learner, adamw, ppo_update, score_batch  # noqa: E402
from verlog.train.storage import RolloutStorage  # noqa: E402
from verlog.weights.actor_critic import load_actor, load_critic, load_reference  # noqa: E402


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every activation")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    where = {"dtype": "float32", "device": "cpu"}
    actor, _ = load_actor("smollm2", lora=LoRAConfig(), **where)
    critic = load_critic("smollm2", **where)
    reference = load_reference("smollm2", **where)
    if not args.no_checkpointing:
        actor.gradient_checkpointing_enable()
        critic.gradient_checkpointing_enable()
    n_actor = sum(p.numel() for p in actor.parameters())
    n_critic = sum(p.numel() for p in critic.parameters())
    floor = (16 * (n_actor + n_critic) + 4 * n_actor) / 2**30
    opts = SimpleNamespace(betas=(0.9, 0.999), weight_decay=0.0)
    algo = AlgorithmConfig(mini_batch_turns=8, micro_batch_tokens=args.micro_batch_tokens, kl_coef=0.001)
    learner = Learner(
        actor,
        critic,
        adamw(actor, SimpleNamespace(lr=1e-5, **vars(opts))),
        adamw(critic, SimpleNamespace(lr=1e-4, **vars(opts))),
        reference,
        algo,
        pad_id=0,
        device=torch.device("cpu"),
    )
    g = torch.Generator().manual_seed(0)
    turns = [
        [
            Turn(
                f"e{i}",
                k,
                torch.randint(100, 5000, (550,), generator=g).tolist(),
                torch.randint(100, 5000, (32,), generator=g).tolist(),
                [-1.0] * 32,
                reward=0.1,
            )
            for k in range(2)
        ]
        for i in range(4)
    ]
    batch = SlotBatch(turns, [slot[0].prompt_ids for slot in turns], [True] * 4, [[0, 0]] * 4)
    print(f"actor {n_actor / 1e6:.0f}M + critic {n_critic / 1e6:.0f}M parameters; floor {floor:.2f} GB")
    for update in range(1, 4):
        storage = RolloutStorage.from_batch(batch)
        tick = time.perf_counter()
        score_batch(storage, learner)
        ppo_update(storage, learner)
        print(
            f"update {update}: {time.perf_counter() - tick:.0f} s, resident {rss_gb():.2f} GB, peak {peak_gb():.2f} GB"
        )
    print(
        f"peak RSS {peak_gb():.2f} GB (target <= 6 GB, floor {floor:.2f} GB); "
        f"gradient checkpointing {'off' if args.no_checkpointing else 'on'}, "
        f"micro-batches of {args.micro_batch_tokens} tokens"
    )


if __name__ == "__main__":
    main()
