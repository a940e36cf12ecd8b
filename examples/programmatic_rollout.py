"""Run a graph file from Python and look at the captured turns.

    python examples/programmatic_rollout.py [graphs/guess_number.py] [--episodes 4]

Everything `verlog rollout` does, in the public API: an engine, verlog's chat model, the graph
file's factory, concurrent episodes with one recorder each.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from verlog.backends.embedded import EmbeddedEngine
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.models import load_causal_lm, load_tokenizer
from verlog.rollout import run_episodes

ROOT = Path(__file__).resolve().parents[1]


async def main(graph_path: str, episodes: int) -> None:
    tokenizer = load_tokenizer("tiny")  # or "smollm2", or a local Hugging Face folder
    engine = EmbeddedEngine(load_causal_lm("tiny"), tokenizer)
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, temperature=1.0, max_tokens=32)

    graph_file = load_graph_file(graph_path)
    graph = graph_file.build(model)
    results = await run_episodes(
        graph,
        [graph_file.episode_input(seed) for seed in range(episodes)],
        graph_config={"recursion_limit": 100},
    )
    for episode in results:
        print(
            f"episode {episode.episode_id}: {episode.status}, {len(episode.turns)} turns, "
            f"return {episode.total_reward:.2f}"
        )
        for turn in episode.turns[:3]:
            print(
                f"  turn {turn.turn_index} ({turn.node}): {len(turn.prompt_ids)} prompt ids, "
                f"{len(turn.response_ids)} response ids, reward {turn.reward}, "
                f"answer {tokenizer.decode(turn.response_ids, skip_special_tokens=True)[:60]!r}"
            )
    await engine.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", default=str(ROOT / "graphs" / "guess_number.py"))
    parser.add_argument("--episodes", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.graph, args.episodes))
