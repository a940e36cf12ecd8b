"""Two evaluations in one process (a notebook, a script calling verlog's Python API twice) against
one endpoint: ``langchain_openai`` shares one async HTTP client per base URL for the process, and
its connections belong to the event loop that opened them; verlog's ``ChatOpenAI`` models keep a
pool per loop, so the second ``asyncio.run`` never meets the first one's closed loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from verlog.backends.embedded import EmbeddedEngine
from verlog.cli import main
from verlog.evaluation.players import EndpointModel
from verlog.evaluation.runner import episode_seeds, play_tasks
from verlog.evaluation.tasks import config_tasks
from verlog.serve import OpenAIServer, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
SHORT = [str(ROOT / "configs" / "guess_number.yaml"), "multi_turn.langgraph.graph_kwargs.max_guesses=2"]


def test_two_evaluations_in_one_process_against_one_endpoint(tiny_model, tiny_tokenizer, tmp_path, capsys):
    """``verlog eval --base-url`` twice through its Python entry point (each run its own
    ``asyncio.run``), then twice through the runner's API: every episode of each is played."""
    from verlog.config import load_config

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer)
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        endpoint = ["--base-url", base_url, "--model", "tiny", "--api-key", "k", "--episodes", "2", "--no-chart"]
        for run in ("first", "second"):
            assert main(["eval", *SHORT, *endpoint, "--out", str(tmp_path / run)]) == 0, capsys.readouterr().out
            lines = (tmp_path / run / "episodes.jsonl").read_text().splitlines()
            assert [json.loads(line)["status"] for line in lines] == ["ok", "ok"]

        config = load_config(SHORT[0], SHORT[1:])
        tasks = config_tasks(config)

        async def evaluate(player: EndpointModel) -> list:
            await player.start()
            seeds = {t.key: episode_seeds(t, 2) for t in tasks}
            return await play_tasks(tasks, player.chat_model, seeds, concurrency=2)

        player = EndpointModel(base_url, "tiny", api_key="k", max_retries=0)  # one player, as a notebook keeps
        for _ in range(2):
            records = asyncio.run(evaluate(player))
            assert [r.status for r in records] == ["ok", "ok"], [r.error for r in records]
    engine.close()
