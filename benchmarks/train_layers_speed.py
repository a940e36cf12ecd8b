"""P10: an update of SmolLM2-135M on the CPU with every layer training, against the last N only.

The turns are BabyAI's as ``configs/babyai_smollm2.yaml`` plays them (its prompt: the action list and
the mission, the current observation, BALROG's answer rule; answers of 2 tokens), rendered with
SmolLM2's chat template. Each setting runs the trainer's whole update in its own process (``score_batch``:
the frozen trunk's pass, old logprobs and the critic's values; ``ppo_update``: one actor and one critic
step), interleaved with
the others so that machine noise hits them alike, with the recipe's settings (fp32, AdamW, micro-batches
of 2,048 tokens, shared prefixes). It prints each setting's seconds per phase and its speed-up over
full fine-tuning (``actor.train_layers`` / ``critic.train_layers``; with both, the blocks below run once
per batch, shared by the actor's and the critic's passes).

    python benchmarks/train_layers_speed.py [--turns 64] [--layers 0,8,4] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "babyai_smollm2.yaml"
PHASES = ("trunk_s", "logprob_s", "value_s", "actor_s", "critic_s")


def recipe_prompts(turns: int, tokenizer) -> list[list[int]]:
    """``turns`` prompt ids of BabyAI "go to" as the recipe's graph shows them (levels 0, 1, ...,
    a few random steps in)."""
    import random

    from verlog.config import load_config
    from verlog.envs import make_env
    from verlog.envs.agent_graph import balrog_wording
    from verlog.envs.balrog_protocol import build_prompt
    from verlog.llm.prompt import PromptRenderer

    kwargs = load_config(CONFIG).multi_turn.langgraph.graph_kwargs
    wording = balrog_wording("babyai:goto", None)
    renderer, rng, prompts = PromptRenderer(tokenizer), random.Random(0), []
    for seed in range(turns):
        env = make_env("babyai:goto", protocol="balrog")
        observation = env.reset(seed)
        for _ in range(rng.randrange(3)):
            result = env.step(rng.choice(env.valid_actions()))
            observation = result.observation
            if result.done:
                observation = env.reset(seed)
        instruction = kwargs["instruction"].replace("{mission}", str(env.mission))
        prompts.append(renderer.render(build_prompt(instruction, [], observation, 0, wording.answer_rule)))
        env.close()
    return prompts


def one_run(layers: int, turns: int, threads: int) -> dict:
    """One update on ``turns`` turns with the last ``layers`` layers training (0: all), in this process."""
    import time

    import torch

    from verlog.config import LoRAConfig, load_config
    from verlog.models import load_tokenizer
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.forward import shared_trunk_depth
    from verlog.train.ppo import Learner, adamw, ppo_update, score_batch
    from verlog.train.storage import RolloutStorage
    from verlog.weights.actor_critic import load_actor, load_critic, train_last_layers

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = load_config(CONFIG)
    tokenizer = load_tokenizer("smollm2")
    actor, _ = load_actor("smollm2", lora=LoRAConfig(), dtype="float32", device="cpu")
    critic = load_critic("smollm2", dtype="float32", device="cpu")
    for model, section in ((actor, "actor"), (critic, "critic")):
        train_last_layers(model, layers or None, section=section)
    # as the trainer does: the frozen blocks below, the same in both models, run once per batch
    depth = len(actor.base_model.layers) - layers
    trunk = shared_trunk_depth(actor.base_model, critic.backbone, depth) if layers else None
    g = torch.Generator().manual_seed(0)
    prompts = recipe_prompts(turns, tokenizer)
    rows = [
        [Turn(f"e{i}", 0, p, torch.randint(100, 5000, (2,), generator=g).tolist(), [-1.0] * 2, reward=float(i % 2))]
        for i, p in enumerate(prompts)
    ]
    batch = SlotBatch(rows, [slot[0].prompt_ids for slot in rows], [True] * turns, [[0]] * turns)
    algo = config.algorithm.model_copy(update={"mini_batch_turns": turns})
    adam = dict(betas=(0.9, 0.999), weight_decay=0.0)
    learner = Learner(
        actor,
        critic,
        adamw(actor, SimpleNamespace(lr=1e-5, **adam)),
        adamw(critic, SimpleNamespace(lr=1e-4, **adam)),
        None,
        algo,
        pad_id=0,
        device=torch.device("cpu"),
        trunk_depth=trunk,
    )
    storage = RolloutStorage.from_batch(batch)
    started = time.perf_counter()
    metrics = score_batch(storage, learner)
    metrics |= ppo_update(storage, learner, generator=torch.Generator().manual_seed(0))
    return {
        "layers": layers,
        "seconds": time.perf_counter() - started,
        "tokens": sum(len(s) for s in storage.sequences),
        "prompt_tokens_mean": sum(len(p) for p in prompts) / len(prompts),
        **{k: metrics.get(k, 0.0) for k in PHASES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--layers", default="0,8,4", help="settings of train_layers to compare (0: every layer)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.turns, args.threads)))
        return
    from verlog.models import smollm2_dir

    smollm2_dir()  # build the offline model once, outside the timed runs
    settings = [int(x) for x in args.layers.split(",")]
    runs: dict[int, list[dict]] = {}
    for _ in range(args.repeats):
        for layers in settings:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    str(layers),
                    "--turns",
                    str(args.turns),
                    "--threads",
                    str(args.threads),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            run = json.loads(out.stdout.strip().splitlines()[-1])
            runs.setdefault(layers, []).append(run)
            print(f"  run: train_layers {layers or 'all'}: {run['seconds']:.1f} s", flush=True)
    best = {layers: min(rs, key=lambda r: r["seconds"]) for layers, rs in runs.items()}
    first = best[settings[0]]
    print(
        f"SmolLM2-135M, fp32, one update of {args.turns} BabyAI turns (prompts of {first['prompt_tokens_mean']:.0f} "
        f"tokens, answers of 2), {args.threads} threads, load {os.getloadavg()[0]:.1f}"
    )
    for layers in settings:
        r = best[layers]
        phases = ", ".join(f"{k[:-2]} {r[k]:.1f}" for k in PHASES)
        print(
            f"  train_layers {str(layers or 'all'):>3}: {r['seconds']:6.1f} s ({phases}); "
            f"{first['seconds'] / r['seconds']:.2f}x the first setting"
        )


if __name__ == "__main__":
    main()
