"""P3: constant context — prompt tokens over a 400-turn Crafter episode (target: >= 50x fewer).

Plays one Crafter episode through ``graphs/crafter.py`` with the same scripted player answering
(a zero-latency engine that reads the current observation from the prompt, so every run takes
the same actions): with the default history window (one previous exchange, as in Verlog) and
concatenating the full history. Prints the prompt tokens processed by each and the ratio (goal:
>= 50x fewer with the window), for two answer styles: terse (one sentence + the action line,
~20 tokens) and reasoning (~100 tokens: the player restates what it sees before acting, closer
to what an instruct model writes). Tokens are counted with the tiny model's byte-level BPE.
Usage: python benchmarks/prompt_tokens.py [--turns 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verlog.envs.agent_graph import recursion_limit_for  # noqa: E402
from verlog.envs.crafter.env import CrafterScriptedAgent  # noqa: E402
from verlog.graph_file import load_graph_file  # noqa: E402
from verlog.llm import VerlogChatModel  # noqa: E402
from verlog.models import load_tokenizer  # noqa: E402
from verlog.rollout import run_episode  # noqa: E402
from verlog.testing.scripted_engine import ScriptedEngine  # noqa: E402

MARK = "Current Observation:\n"


def scripted_player(tokenizer, reasoning: bool):
    """An engine script: decode the prompt, act on its current observation."""
    agent = CrafterScriptedAgent(seed=0)

    def answer(prompt_ids: list[int]) -> str:
        text = tokenizer.decode(prompt_ids)
        observation = text[text.rindex(MARK) + len(MARK) :].split("<|im_end|>")[0]
        thought = "I look around and pick my next move."
        if reasoning:  # restate the surroundings and status, as a model's reasoning would
            lines = observation.splitlines()
            thought = "Let me think. " + " ".join(lines[2:5] + lines[-2:])[:400]
        return f"{thought}\n{agent.act(observation)}"

    return answer


async def play(
    tokenizer, history_turns: int | None, turns: int, seed: int, reasoning: bool
) -> tuple[list[int], list[int], float]:
    graph_file = load_graph_file(ROOT / "graphs" / "crafter.py")
    engine = ScriptedEngine(tokenizer, scripted_player(tokenizer, reasoning))
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, max_tokens=512)
    graph = graph_file.build(model, history_turns=history_turns, max_steps=turns)
    t0 = time.perf_counter()
    episode = await run_episode(
        graph, graph_file.episode_input(seed), graph_config={"recursion_limit": recursion_limit_for(turns)}
    )
    assert episode.status == "ok", episode.error
    prompts = [len(t.prompt_ids) for t in episode.turns]
    answers = [len(t.response_ids) for t in episode.turns]
    return prompts, answers, time.perf_counter() - t0


async def main(turns: int, seed: int) -> None:
    tokenizer = load_tokenizer("tiny")
    print(f"Crafter seed {seed}, {turns}-turn cap, tokens of the tiny model's tokenizer")
    for style, reasoning in (("terse", False), ("reasoning", True)):
        window, answers, t_window = await play(tokenizer, 1, turns, seed, reasoning)
        full, _, t_full = await play(tokenizer, None, turns, seed, reasoning)
        n = min(len(window), len(full))
        print(f"{style} answers (mean {sum(answers) / len(answers):.0f} tokens), {n} turns:")
        print(
            f"  history window (1 exchange): {sum(window[:n]):>12,} prompt tokens "
            f"(max {max(window):,}/turn, {t_window:.1f} s)"
        )
        print(
            f"  full history               : {sum(full[:n]):>12,} prompt tokens "
            f"(max {max(full):,}/turn, {t_full:.1f} s)"
        )
        ratio = sum(full[:n]) / sum(window[:n])
        print(
            f"  ratio: {ratio:.1f}x fewer with the window (target >= 50x) "
            f"{'OK' if ratio >= 50 and n >= 400 else 'MISSED'}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.seed))
