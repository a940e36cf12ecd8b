"""Learning from production traces alone: the served model improves by the loop serve -> record ->
feedback -> train from traces -> hot swap, with no rollout of its own.

`verlog serve-model MODEL --record STORE --reload-from RUN` runs as its own process. Each cycle:
--episodes cue-corridor episodes (fresh seeds) play against it through LangChain's ChatOpenAI (verlog.traces.episode_chat_openai), as
production clients would; each gets feedback from the client's side (the episode's outcome, 1 if it
reached the end, on the episode; -0.1 on each turn whose answer was not a move, as a judge of the
turn would); then `verlog train` makes --updates-per-cycle updates from the trace store alone
(`data.traces`, fraction 1: no live slots) and `POST /v1/admin/reload` swaps the new checkpoint in.
The staleness rule is stated and applied: turns served by a version more than --max-versions
versions behind the newest are dropped, the others weigh --decay ** staleness.

Success is measured on --eval-episodes held-out seeds through the served model, before the first
cycle and after the last (mean +- standard error), beside the success of each cycle's episodes.

Writes the per-cycle figures to OUT/trace_learning.json and draws OUT/trace_learning.png.

Usage: python benchmarks/trace_learning.py [--model toy] [--cycles 40] [--episodes 64]
       [--updates-per-cycle 1] [--max-versions 1] [--decay 0.5] [--eval-episodes 128]
       [--out runs/trace_learning]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from langchain_core.callbacks import BaseCallbackHandler
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, free_port, wait_healthy  # noqa: E402

from verlog.config import load_config  # noqa: E402
from verlog.evaluation.results import mean_se  # noqa: E402
from verlog.graph_file import load_graph_file  # noqa: E402
from verlog.traces import TraceStore, episode_chat_openai, open_store  # noqa: E402
from verlog.train import train  # noqa: E402

sys.path.insert(0, str(ROOT))
from graphs.cue_corridor import MOVES  # noqa: E402

LENGTH, MAX_TURNS = 4, 10
EVAL_SEED = 1_000_000
#: the served model's admin key (reload is closed without one)
ADMIN_KEY = "trace-learning-admin"


class _Answers(BaseCallbackHandler):
    """The answers the client received, in call order."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def on_llm_end(self, response, **kwargs) -> None:
        self.texts.append(response.generations[0][0].text)


async def _play(
    base_url: str, model_name: str, seeds: list[int], tag: str, concurrency: int = 32
) -> list[tuple[str, bool, list[str]]]:
    """Episodes of the corridor served by the server: (episode id, success, the answers)."""
    graph_file = load_graph_file(ROOT / "graphs" / "cue_corridor.py")
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> tuple[str, bool, list[str]]:
        episode = f"{tag}-{seed}"
        model = episode_chat_openai(
            base_url=base_url, api_key="unused", model=model_name, temperature=1.0, max_retries=2
        )
        graph = graph_file.build(model, length=LENGTH, max_turns=MAX_TURNS)
        answers = _Answers()
        async with gate:
            final = await graph.ainvoke(
                graph_file.episode_input(seed),
                {
                    "recursion_limit": 4 * MAX_TURNS + 10,
                    "callbacks": [answers],
                    "configurable": {"episode_id": episode},
                },
            )
        return episode, final["pos"] >= LENGTH, answers.texts

    return await asyncio.gather(*(one(s) for s in seeds))


def _feedback(store: TraceStore, played: list[tuple[str, bool, list[str]]]) -> None:
    """The outcome on each episode, -0.1 on each turn that was not a move (the Python call)."""
    for episode, success, answers in played:
        for i, answer in enumerate(answers):
            words = answer.split()
            if not words or words[0].lower() not in MOVES:
                store.add_feedback(episode, -0.1, turn_index=i)
        store.add_feedback(episode, 1.0 if success else 0.0, success=success)


def main() -> None:
    asyncio.run(_main())


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy")
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=64, help="production episodes per cycle")
    parser.add_argument("--updates-per-cycle", type=int, default=1)
    parser.add_argument("--max-versions", type=int, default=1, help="drop turns more versions behind than this")
    parser.add_argument("--decay", type=float, default=0.5, help="weight decay ** staleness")
    parser.add_argument("--eval-episodes", type=int, default=128)
    parser.add_argument(
        "--out",
        default=str(ROOT / "runs" / "trace_learning"),
        help="where the trace store, the run and the figures go (emptied first)",
    )
    args = parser.parse_args()

    work = Path(args.out)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    store_dir, run_dir, port = work / "traces", work / "run", free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verlog.serve",
            "serve-model",
            args.model,
            "--port",
            str(port),
            "--record",
            str(store_dir),
            "--reload-from",
            str(run_dir),
            "--device",
            "cpu",
            "--max-queue",
            "1024",
            "--admin-key",
            ADMIN_KEY,
        ],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=open(work / "server.log", "w"),
    )
    started = time.perf_counter()
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", server)
        version = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["version"]
        store = open_store(store_dir)
        print(
            f"load {os.getloadavg()[0]:.2f}; serving {args.model} (version {version}); {args.cycles} cycles x "
            f"{args.episodes} episodes, {args.updates_per_cycle} update(s) per cycle from traces alone; staleness "
            f"rule: drop beyond {args.max_versions} versions behind, weight {args.decay} ** staleness; work {work}"
        )
        eval_seeds = list(range(EVAL_SEED, EVAL_SEED + args.eval_episodes))
        before = [float(s) for _, s, _ in await _play(base_url, args.model, eval_seeds, "eval-before")]
        overrides = [
            f"model.path={args.model}",
            f"trainer.run_dir={run_dir}",
            "wandb.mode=disabled",
            f"data.traces.store={store_dir}",
            f"data.traces.staleness.max_versions={args.max_versions}",
            f"data.traces.staleness.decay={args.decay}",
            "eval.at_start=false",
            "eval.at_end=false",
            "trainer.save_every=1",
        ]
        cycles: list[dict] = []
        for cycle in range(args.cycles):
            seeds = list(range(cycle * args.episodes, (cycle + 1) * args.episodes))
            played = await _play(base_url, args.model, seeds, f"c{cycle}")
            _feedback(store, played)
            wins = sum(s for _, s, _ in played) / len(played)
            config = load_config(
                ROOT / "configs" / "cue_corridor.yaml",
                [*overrides, f"trainer.total_updates={(cycle + 1) * args.updates_per_cycle}"],
            )
            result = await asyncio.to_thread(train, config, resume=cycle > 0, console=Console(quiet=True))
            logged = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
            swapped = (
                await asyncio.to_thread(
                    httpx.post,
                    f"{base_url}/admin/reload",
                    timeout=300,
                    headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                )
            ).json()
            mean, se = mean_se([float(s) for _, s, _ in played])
            cycles.append(
                {
                    "cycle": cycle + 1,
                    "version": version,
                    "served_success": mean,
                    "served_se": se,
                    "staleness_weight": logged.get("staleness_weight"),
                    "behaviour_weight": logged.get("behaviour_weight"),
                    "seconds": time.perf_counter() - started,
                }
            )
            version = swapped["version"]
            print(
                f"cycle {cycle + 1:3d}: served success {wins:.3f} -> update {result.updates}, "
                f"staleness weight {logged.get('staleness_weight', float('nan')):.3f}, dropped turns "
                f"{logged.get('trace_dropped_turns', 0):.0f}, behaviour weight {logged.get('behaviour_weight', 1):.3f}; "
                f"now serving {swapped['version']} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        after = [float(s) for _, s, _ in await _play(base_url, args.model, eval_seeds, "eval-after")]
        (b, bse), (a, ase) = mean_se(before), mean_se(after)
        print(
            f"held-out success over {len(eval_seeds)} seeds: before {b:.3f} +- {bse:.3f} -> after {a:.3f} +- {ase:.3f} "
            f"({args.cycles * args.updates_per_cycle} updates from traces alone, {time.perf_counter() - started:.0f} s, "
            f"load {os.getloadavg()[0]:.2f})"
        )
        summary = {"settings": vars(args), "before": [b, bse], "after": [a, ase], "cycles": cycles}
        (work / "trace_learning.json").write_text(json.dumps(summary, indent=1))
        _plot(work / "trace_learning.png", summary)
        print(f"figures: {work / 'trace_learning.json'}, {work / 'trace_learning.png'}")
        store.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def _plot(png: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, cycles = summary["settings"], summary["cycles"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(
        [c["cycle"] for c in cycles],
        [c["served_success"] for c in cycles],
        yerr=[c["served_se"] for c in cycles],
        marker="o",
        markersize=3,
        capsize=2,
        label=f"production episodes of each cycle ({s['episodes']}, +- s.e.)",
    )
    last = cycles[-1]["cycle"] if cycles else 0
    for x, (mean, se), name, side in (
        (0, summary["before"], "before", "left"),
        (last, summary["after"], "after", "right"),
    ):
        ax.errorbar([x], [mean], yerr=[se], marker="s", color="black", capsize=4)
        ax.annotate(
            f"held-out {name}: {mean:.2f} +- {se:.2f}",
            (x, mean),
            textcoords="offset points",
            xytext=(6 if side == "left" else -6, 8),
            ha=side,
            fontsize=8,
        )
    ax.set_xlabel(f"cycle: serve, feedback, {s['updates_per_cycle']} update(s) from traces alone, hot swap")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(
        f"cue corridor, {s['model']} model; staleness: drop > {s['max_versions']} versions, "
        f"weight {s['decay']}^versions",
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
