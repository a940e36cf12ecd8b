"""The SGLang path without a GPU: the embedded engine behind SGLang's `/generate` protocol.

    python examples/sglang_protocol.py

Starts verlog's SGLang-compatible server on 127.0.0.1 in front of the tiny model, then runs a
graph whose chat model talks to it over HTTP with `SGLangEngine` — exactly the client used
against a real SGLang server (`engine.kind: sglang` in a config).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.sglang import SGLangEngine
from verlog.backends.sglang_server import SGLangCompatServer
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.models import load_causal_lm, load_tokenizer
from verlog.rollout import run_episodes

ROOT = Path(__file__).resolve().parents[1]


async def main() -> None:
    tokenizer = load_tokenizer("tiny")
    backend = EmbeddedEngine(load_causal_lm("tiny"), tokenizer)
    async with SGLangCompatServer(backend) as server:
        client = SGLangEngine(server.url, eos_token_ids=(tokenizer.eos_token_id,))
        await client.wait_until_ready(timeout=10)
        model = VerlogChatModel(engine=client, tokenizer=tokenizer, max_tokens=16)
        graph_file = load_graph_file(ROOT / "graphs" / "guess_number.py")
        episodes = await run_episodes(
            graph_file.build(model, max_guesses=3),
            [graph_file.episode_input(s) for s in range(3)],
            graph_config={"recursion_limit": 20},
        )
        await client.aclose()
        print(f"server {server.url} served {server.stats.served} /generate requests")
    for e in episodes:
        print(f"{e.episode_id}: {e.status}, {len(e.turns)} turns, logprobs of turn 0: {e.turns[0].logprobs[:3]}")
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
