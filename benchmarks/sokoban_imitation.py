"""Can ``sokoban-words`` hold a good Sokoban policy at all? Imitation of the oracle, as a ceiling.

``benchmarks/sokoban_learning.py`` trains ``sokoban-words`` with PPO from scratch; when it does not
get past random valid moves, the question is whether the model is too small to hold a policy that
does, or whether reinforcement learning fails to find one. This script answers the first part: it
fits the same random-init model, by plain cross-entropy, to the oracle's moves (the first move of
a shortest solution, ``verlog.envs.sokoban.solver``) on the training rooms (seeds 0, 1, ...), each
prompt built as ``graphs/sokoban.py`` builds it with ``configs/sokoban_words.yaml``'s settings (the
current room under the one-word instruction), and then plays the held-out rooms (seeds 65536+,
as the learning benchmark evaluates) greedily and sampled at temperature 1, beside random valid moves.

    python benchmarks/sokoban_imitation.py                      # 3000 training rooms, 15 epochs
    python benchmarks/sokoban_imitation.py --rooms 500 --epochs 3

Prints the move accuracy per epoch (training and held-out oracle states) and the success rates
(mean ± s.e.); writes ``benchmarks/results/sokoban_learning/imitation.json``. One CPU thread.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.config import load_config  # noqa: E402
from verlog.envs.agent_graph import build_prompt  # noqa: E402
from verlog.envs.sokoban import ACTIONS, HELD_OUT_SEED_START, SokobanEnv  # noqa: E402
from verlog.envs.sokoban.solver import solve  # noqa: E402
from verlog.llm.prompt import PromptRenderer  # noqa: E402
from verlog.models import load_causal_lm, load_tokenizer, resolve_model_path  # noqa: E402

CONFIG = ROOT / "configs" / "sokoban_words.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "sokoban_learning" / "imitation.json"


class Policy:
    """``sokoban-words`` scoring the four moves after a room's prompt (its logits at the answer)."""

    def __init__(self, instruction: str, seed: int = 0):
        torch.manual_seed(seed)
        path = resolve_model_path("sokoban-words")
        self.tokenizer = load_tokenizer(path)
        self.model = load_causal_lm(path)
        self.renderer = PromptRenderer(self.tokenizer)
        self.instruction = instruction
        self.moves = [self.tokenizer.convert_tokens_to_ids(a) for a in ACTIONS]

    def prompt(self, observation: str) -> list[int]:
        return self.renderer.render(build_prompt(self.instruction, [], observation, 0))

    def logits(self, prompts: list[list[int]]) -> torch.Tensor:
        """The moves' logits after each prompt (left-padded; positions as the engine counts them)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        return out[:, -1, self.moves]


def oracle_pairs(policy: Policy, seeds: range) -> tuple[list[list[int]], list[int]]:
    """(prompt, oracle move) at every state of each room's shortest solution."""
    prompts, moves = [], []
    for seed in seeds:
        env = SokobanEnv()
        observation = env.reset(seed)
        for move in solve(env.room, env.state) or []:
            prompts.append(policy.prompt(observation))
            moves.append(ACTIONS.index(move))
            result = env.step(move)
            observation = result.observation
            if result.done:
                break
    return prompts, moves


def oracle_move_probability(policy: Policy, seeds: range) -> dict[str, float]:
    """The policy's mean probability of the oracle's move over the states of each room's shortest
    solution, by how far the state is from solved (``"1"`` .. ``"4"``, ``"5+"`` moves): where a
    policy learns first (one move from a win, the reward comes at once) and how far back it reaches.
    A uniform policy over the four moves scores 0.25 everywhere."""
    prompts, moves = [], []
    bucket: list[str] = []
    for seed in seeds:
        env = SokobanEnv()
        observation = env.reset(seed)
        plan = solve(env.room, env.state) or []
        for k, move in enumerate(plan):
            prompts.append(policy.prompt(observation))
            moves.append(ACTIONS.index(move))
            bucket.append(str(len(plan) - k) if len(plan) - k < 5 else "5+")
            observation = env.step(move).observation
    with torch.no_grad():
        chosen = torch.softmax(policy.logits(prompts), -1)[torch.arange(len(moves)), torch.tensor(moves)]
    return {
        key: float(chosen[[i for i, b in enumerate(bucket) if b == key]].mean())
        for key in ("1", "2", "3", "4", "5+")
        if key in bucket
    }


def play(policy: Policy | None, seeds: range, temperature: float, rng: random.Random) -> dict[str, float]:
    """Success rate (mean ± s.e.) on ``seeds``: the policy greedy (temperature 0) or sampled, or
    (``policy`` None) random valid moves."""
    wins = []
    for seed in seeds:
        env = SokobanEnv()
        observation = env.reset(seed)
        won = False
        for _ in range(env.max_steps):
            if policy is None:
                move = rng.choice(env.valid_actions())
            else:
                with torch.no_grad():
                    logits = policy.logits([policy.prompt(observation)])[0]
                if temperature == 0:
                    move = ACTIONS[int(logits.argmax())]
                else:
                    move = ACTIONS[int(torch.multinomial(torch.softmax(logits / temperature, -1), 1))]
            result = env.step(move)
            observation = result.observation
            if result.done:
                won = env.won
                break
        wins.append(float(won))
    mean = sum(wins) / len(wins)
    return {"success": mean, "se": math.sqrt(mean * (1 - mean) / max(1, len(wins) - 1)), "rooms": len(wins)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=3000, help="training rooms (seeds 0 ...)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--eval-rooms", type=int, default=128, help="held-out rooms played")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the result file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kwargs = load_config(CONFIG).multi_turn.langgraph.graph_kwargs
    policy = Policy(str(kwargs.get("instruction", "")))
    started = time.perf_counter()
    train_x, train_y = oracle_pairs(policy, range(args.rooms))
    test_x, test_y = oracle_pairs(policy, range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 300))
    train_t, test_t = torch.tensor(train_y), torch.tensor(test_y)
    print(f"{len(train_x)} oracle moves from {args.rooms} training rooms, {len(test_x)} held-out", flush=True)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=args.lr)
    curve: list[dict[str, Any]] = []
    for epoch in range(1, args.epochs + 1):
        policy.model.train()
        order = torch.randperm(len(train_x))
        for i in range(0, len(order), 128):
            rows = order[i : i + 128]
            loss = torch.nn.functional.cross_entropy(policy.logits([train_x[j] for j in rows]), train_t[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        policy.model.eval()
        with torch.no_grad():
            train_acc = (policy.logits(train_x[:1000]).argmax(-1) == train_t[:1000]).float().mean().item()
            test_acc = (policy.logits(test_x).argmax(-1) == test_t).float().mean().item()
        curve.append({"epoch": epoch, "train_accuracy": train_acc, "held_out_accuracy": test_acc})
        print(
            f"  epoch {epoch}: oracle moves matched {train_acc:.3f} (training), {test_acc:.3f} (held out), "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
    held_out = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + args.eval_rooms)
    rng = random.Random(0)
    result = {
        "rooms": args.rooms,
        "oracle_moves": len(train_x),
        "epochs": args.epochs,
        "curve": curve,
        "greedy": play(policy, held_out, 0.0, rng),
        "sampled": play(policy, held_out, 1.0, rng),
        "random": play(None, held_out, 1.0, rng),
        "wall_s": time.perf_counter() - started,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1))
    for name in ("greedy", "sampled", "random"):
        r = result[name]
        print(f"{name:>8}: {r['success']:.3f} ± {r['se']:.3f} of {r['rooms']} held-out rooms solved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
