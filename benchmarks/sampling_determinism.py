"""Reproducible sampling: the same evaluation, at temperature 1, played one episode at a time, many
at once, and many at once with the machine's other core busy, must play the same episodes.

Evaluates the quick start's model (``configs/quickstart.yaml``: ``babyai-words`` on BabyAI "go
to", its initial random weights; ``--checkpoint`` for a trained one) on 32 held-out levels at
temperature 1, each setting on a fresh engine, through ``verlog eval``'s own players and runner:

* the embedded engine at concurrency 1, at concurrency 32, and at 32 with a busy loop (under
  ``nice``) taking the other core;
* ``verlog serve-model`` on the same weights (its OpenAI server, in this process), evaluated through
  the endpoint player (LangChain's ``ChatOpenAI``, each call sending its seed) at concurrency 1
  and 32; ``--no-endpoint`` leaves it out.

An episode is the same when every answer of the model, in order, is the same text (and so its
turns, return and outcome). Prints, per setting, how many of the episodes are the same as in the
first (the engine at concurrency 1), the win rate and the seconds taken.

    python benchmarks/sampling_determinism.py [--episodes 32] [--concurrency 32] [--temperature 1]
        [--config configs/quickstart.yaml] [--checkpoint RUN] [--no-endpoint]

Measured 2026-12-06 on this project's 2 CPU cores (shared with other jobs), before and after
per-call seeds: README, *Evaluation*, "Reproducible sampling" (about 3 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402

from verlog.config import load_config  # noqa: E402
from verlog.evaluation.players import EndpointModel, EngineModel  # noqa: E402
from verlog.evaluation.runner import episode_seeds, play_tasks  # noqa: E402
from verlog.evaluation.tasks import config_tasks  # noqa: E402
from verlog.llm.chat_model import EPISODE_ID_KEY  # noqa: E402


class AnswerLog(BaseCallbackHandler):
    """Every answer of the model, per episode, in the order its calls started."""

    run_inline = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[UUID, tuple[str, int]] = {}
        self.answers: dict[str, dict[int, str]] = {}

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        episode = str((kwargs.get("metadata") or {}).get(EPISODE_ID_KEY))
        with self._lock:
            calls = self.answers.setdefault(episode, {})
            self._calls[run_id] = (episode, len(calls))
            calls[len(calls)] = ""

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        text = str(response.generations[0][0].message.content)
        with self._lock:
            episode, index = self._calls.pop(run_id)
            self.answers[episode][index] = text

    def digests(self) -> dict[str, str]:
        """Per episode, a digest of its answers in order."""
        return {
            episode: hashlib.sha1("\x00".join(calls[i] for i in sorted(calls)).encode()).hexdigest()
            for episode, calls in self.answers.items()
        }


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A busy loop under ``nice -n 19`` in another process, for as long as the block runs."""
    proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait()


async def play(config: Any, player: Any, episodes: int, concurrency: int) -> tuple[dict[str, str], float, float]:
    """One evaluation: (each episode's digest, win rate, seconds)."""
    log = AnswerLog()
    tasks = config_tasks(config)
    seeds = {t.key: episode_seeds(t, episodes) for t in tasks}
    started = time.perf_counter()
    await player.start()
    try:
        records = await play_tasks(
            tasks,
            lambda task: player.chat_model(task).model_copy(update={"callbacks": [log]}),
            seeds,
            concurrency=concurrency,
        )
    finally:
        await player.aclose()
    failed = [r for r in records if r.status != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} episodes failed, e.g. {failed[0].error_line}")
    return log.digests(), sum(r.success for r in records) / len(records), time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--no-endpoint", action="store_true")
    args = p.parse_args()
    # no episode timeout: a loaded machine must not fail an episode of a benchmark about draws
    config = load_config(args.config, ["model.device=cpu", "rollout.episode_timeout_s=null"])
    many = args.concurrency

    def engine_player() -> EngineModel:
        return EngineModel(config, args.checkpoint, temperature=args.temperature)

    settings: list[tuple[str, str, Any, int, bool]] = [
        ("engine", "concurrency 1", engine_player, 1, False),
        ("engine", f"concurrency {many}", engine_player, many, False),
        ("engine", f"concurrency {many}, other core busy", engine_player, many, True),
    ]
    print(f"{args.episodes} episodes of {Path(args.config).name} at temperature {args.temperature}")
    reference: dict[str, dict[str, str]] = {}  # the first setting's digests
    with contextlib.ExitStack() as stack:
        if not args.no_endpoint:
            from verlog.serve import OpenAIServer, serve_in_thread

            served = engine_player()
            asyncio.run(served.start())
            server = OpenAIServer(served.engine, served.tokenizer, model_name="policy")
            base_url = stack.enter_context(serve_in_thread(server))

            def endpoint_player() -> EndpointModel:
                return EndpointModel(base_url, "policy", temperature=args.temperature, max_retries=0)

            settings += [
                ("serve-model", "concurrency 1", endpoint_player, 1, False),
                ("serve-model", f"concurrency {many}", endpoint_player, many, False),
            ]
        for player_kind, label, make_player, concurrency, busy in settings:
            with busy_core() if busy else contextlib.nullcontext():
                digests, win_rate, seconds = asyncio.run(play(config, make_player(), args.episodes, concurrency))
            first = reference.setdefault("first", digests)
            same = sum(first.get(episode) == digest for episode, digest in digests.items())
            print(
                f"{player_kind:>11}, {label:<34} same as the first: {same:>3}/{len(digests)}   "
                f"win rate {win_rate:.3f}   {seconds:6.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
