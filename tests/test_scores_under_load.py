"""A score never depends on how busy the machine is: the quick start's evaluation on an engine that
answers every call late (a queue on a loaded machine) scores exactly what it scores on the same
engine answering at once, with no episode lost to time, though the slowed episodes take several
times their ``episode_timeout_s`` of wall time: the timeout counts the graph's own code only."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from verlog.backends.embedded import EmbeddedEngine
from verlog.config import load_config
from verlog.evaluation import evaluate
from verlog.models import load_causal_lm, load_tokenizer, resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
EPISODES = 4
#: each model call waits this long before it is answered (a level takes up to 64 calls: 19 s)
DELAY_S = 0.3
#: an episode's graph may spend this long in its own code (about 1-2 s here, two episodes at a time;
#: a slowed episode takes far longer in all)
TIMEOUT_S = 8.0


class BusyEngine(EmbeddedEngine):
    """The embedded engine on a machine busy with something else: each call waits ``DELAY_S`` first."""

    async def generate(self, prompt_ids, sampling, *, request_id=None):
        await asyncio.sleep(DELAY_S)
        return await super().generate(prompt_ids, sampling, request_id=request_id)


@pytest.mark.timeout(600)
def test_the_quickstart_evaluation_scores_the_same_on_a_slowed_engine():
    config = load_config(
        ROOT / "configs" / "quickstart.yaml", [f"rollout.episode_timeout_s={TIMEOUT_S}", "eval.concurrency=2"]
    )
    path = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)

    def run(engine_class: type[EmbeddedEngine]) -> tuple[list, float]:
        engine = engine_class(model, tokenizer, seed=0, max_batch_size=config.engine.max_batch_size)
        started = time.perf_counter()
        try:  # greedy: the same levels give the same moves, whatever order the engine batches them in
            results = asyncio.run(evaluate(config, engine, tokenizer, episodes=EPISODES, temperature=0.0))
        finally:
            engine.close()
        return results, time.perf_counter() - started

    (idle,), _ = run(EmbeddedEngine)
    (busy,), busy_s = run(BusyEngine)
    assert idle.episodes == busy.episodes == EPISODES and idle.errors == busy.errors == 0  # none lost to time
    assert (busy.win_rate, busy.return_mean, busy.length_mean) == (idle.win_rate, idle.return_mean, idle.length_mean)
    # the slowed episodes ran far past the timeout in wall time: the queue was not counted
    assert busy_s > 2 * TIMEOUT_S
