"""Playing seeded evaluation episodes: concurrently, scored as they end, resumable from disk.

* :func:`play_episode` runs one episode of a task's graph and scores it (:class:`EpisodeRecord`):
  status, model calls, return, success and BALROG's progression (0-100). It works with any
  LangChain chat model: scoring reads the environment's reward events, not captured tokens, and
  the config's reward section (reward functions, judges) on the episode's final state and row.
  A task's episodes play seeds, or the rows of a data split (``EvalTask.split``: never training
  rows).
* :class:`EpisodeLog` is the ``episodes.jsonl`` of an output folder: one line appended per
  finished episode, read back on restart so finished episodes are not played again.
* :func:`play_tasks` plays every (task, seed) that is not finished yet, at most ``concurrency``
  at a time, seeds in round-robin over the tasks (an interrupted run covers every task).
* :func:`evaluate` is what the trainer calls: a config's tasks on an engine, in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from uuid import UUID

from verlog.envs.progression import goal_value
from verlog.envs.registry import find_family, progression
from verlog.episodes import EpisodePlan, build_scorer
from verlog.evaluation.results import PROGRESSION_SCALE, EpisodeRecord, TaskResult, summarize
from verlog.evaluation.tasks import EvalTask, config_tasks
from verlog.graph_file import GraphFile, load_graph_file
from verlog.rewards import RewardError, RewardScorer
from verlog.rollout.events import REWARD_EVENT
from verlog.rollout.interrupts import InterruptResponder
from verlog.rollout.recorder import NO_TRAIN_TAG, TurnRecorder
from verlog.rollout.runner import run_episode
from verlog.step_info import PROGRESSION_KEY, StepInfo, episode_won

__all__ = [
    "EpisodeLog",
    "EvalError",
    "ScoreRecorder",
    "episode_progression",
    "episode_seeds",
    "evaluate",
    "play_episode",
    "play_tasks",
    "task_spec",
]


class EvalError(RuntimeError):
    """An evaluation cannot start or go on; the message says why and what to do."""


class ScoreRecorder(TurnRecorder):
    """A recorder that keeps only what scoring needs: the number of model calls, the rewards and
    the environment's latest info. It works whatever chat model answers (an endpoint's
    ``ChatOpenAI`` carries no token data) and keeps no token ids in memory.

    Each call samples with a seed of its own, derived from the episode's id (its task and seed,
    or its split's row) and the call's place in the episode (:mod:`verlog.llm.call_seeds`): an
    evaluation plays the same episodes however many run at once and whatever else the machine
    does."""

    def __init__(self, episode_id: str):
        super().__init__(episode_id, sampling_key=episode_id)
        self.model_calls = 0
        self.info: StepInfo = StepInfo()  # the environment's latest, merged

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:  # (the chain runs it tracks tell each call's place, for its seed)
            self._seed_call(run_id, kwargs.get("parent_run_id"))
            if NO_TRAIN_TAG in (kwargs.get("tags") or ()):
                return  # a judge or summarizer reusing the model: not one of the agent's moves
            self.model_calls += 1

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:  # no turns: every reward is summed in ``unassigned_reward``
            self._call_over(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._call_over(run_id)

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        super().on_custom_event(name, data, **kwargs)  # checks the event, adds the reward
        if name == REWARD_EVENT and data.get("info"):
            with self._lock:
                self.info.update(data["info"])


def episode_progression(env: str, info: Mapping[str, Any], success: bool) -> float:
    """BALROG's progression of an episode on 0-100: the environment's own when it reports one
    (or its family's definition), else 100 for a reached goal and 0 otherwise."""
    if PROGRESSION_KEY in info or find_family(env) is not None:
        return PROGRESSION_SCALE * progression(env, info)
    return PROGRESSION_SCALE * goal_value(success)


def _small_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The plain values of an info dict (numbers, flags, short strings, lists of names)."""
    kept: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 200):
            kept[key] = value
        elif isinstance(value, (list, tuple)) and len(value) <= 64 and all(isinstance(v, str) for v in value):
            kept[key] = list(value)
    return kept


def task_spec(task: EvalTask, model: str, sampling: Mapping[str, Any]) -> str:
    """A short digest of what defines the task's episodes: the model, its sampling settings, the
    graph (file name, keyword arguments such as the protocol, history length and answer budget,
    run config) and the episode time limit. Finished episodes are reused only by an evaluation
    with the same digest."""
    lg = task.config.multi_turn.langgraph
    data = {
        "model": model,
        "sampling": dict(sampling),
        "graph": Path(lg.path).name,
        "graph_kwargs": task.graph_kwargs,
        "graph_config": lg.graph_config,
        "episode_timeout_s": task.config.rollout.episode_timeout_s,
    }
    if lg.on_interrupt:  # who answers the graph's interrupt() pauses decides how its episodes go
        data["on_interrupt"], data["max_resumes"] = lg.on_interrupt, lg.max_resumes
    if task.split is not None:  # a data split's rows, scored by the reward section
        data["data"] = task.config.data.split(task.split).model_dump()
        data["reward"] = task.config.reward.model_dump()
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


async def play_episode(task: EvalTask, graph: Any, plan: EpisodePlan, seed: int, *, spec: str = "") -> EpisodeRecord:
    """Play the task's episode ``seed`` (a seed, or a row of the task's split) once and score it:
    the graph's own rewards plus the reward section's (never raises for the graph's or a reward
    function's failures: they are ``error`` episodes). An episode timeout (the graph's own code
    running past ``rollout.episode_timeout_s``; time in model calls never counts) is an ``error``
    too: left out of the scores and played again by the next run, never a loss."""
    recorder = ScoreRecorder(task.episode_id(seed))
    try:
        graph_input = plan.input(seed)
    except Exception as exc:  # make_input / the row's mapping failed: this episode errs, not the run
        graph_input, failure = None, f"the input of {task.episode_id(seed)} failed: {type(exc).__name__}: {exc}"
    else:
        failure = None
    if failure is None:
        episode = await run_episode(
            graph,
            graph_input,
            graph_config=task.config.multi_turn.langgraph.graph_config,
            timeout_s=task.config.rollout.episode_timeout_s,
            recorder=recorder,
            interrupts=InterruptResponder.from_config(task.config.multi_turn.langgraph),
        )
        if episode.status == "timeout":  # the graph's own code ran too long: no verdict on the agent's play
            episode.status = "error"
    else:
        episode = recorder.episode("error", error=failure)
    info, episode_return = recorder.info, episode.total_reward
    if not episode.failed:
        try:
            outcome = await plan.outcome(episode, seed, info=info)
        except RewardError as exc:
            episode.status, episode.error = "error", str(exc)
        else:
            if outcome is not None:
                info, episode_return = outcome.merge_info(info), episode_return + outcome.reward
    success = not episode.failed and episode_won(info)
    return EpisodeRecord(
        episode_id=recorder.episode_id,
        env=task.env,
        task=task.name,
        seed=seed,
        status=episode.status,
        turns=recorder.model_calls,
        episode_return=episode_return,
        success=success,
        progression=episode_progression(task.env, info, success),
        seconds=round(episode.seconds, 3),
        error=episode.error,
        spec=spec,
        finished_at=round(time.time(), 3),
        info=_small_info(info),
    )


class EpisodeLog:
    """``episodes.jsonl`` in an output folder: one JSON line per finished episode.

    Lines are appended and flushed as episodes end, so a killed evaluation loses only the
    episodes that were in flight. Reading back, the last line of an id wins, and a line cut
    short by a kill is skipped.
    """

    FILE_NAME = "episodes.jsonl"

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / self.FILE_NAME
        self.skipped_lines = 0
        self._file: Any = None

    def read(self) -> dict[str, EpisodeRecord]:
        """The latest record of every episode id in the file (empty when there is no file)."""
        records: dict[str, EpisodeRecord] = {}
        self.skipped_lines = 0
        if not self.path.is_file():
            return records
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = EpisodeRecord.from_json(json.loads(line))
            except (ValueError, TypeError, KeyError):
                self.skipped_lines += 1
                continue
            records[record.episode_id] = record
        return records

    def clear(self) -> None:
        """Forget every recorded episode."""
        self.close()
        self.path.unlink(missing_ok=True)

    def append(self, record: EpisodeRecord) -> None:
        """Write one record and flush it to the operating system."""
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            cut = self.path.is_file() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
            self._file = self.path.open("a", encoding="utf-8")
            if cut:  # the previous run was killed mid-line: start on a fresh one
                self._file.write("\n")
        self._file.write(json.dumps(record.to_json()) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _graphs(
    tasks: Sequence[EvalTask],
    chat_model_for: Callable[[EvalTask], Any],
    scorer_for: Callable[[EvalTask], RewardScorer | None] | None,
) -> dict[tuple[str, str], tuple[Any, EpisodePlan]]:
    """Each task's graph (built around its player) and episode plan (its seeds or split rows, and
    its reward section; one scorer per config unless ``scorer_for`` gives them)."""
    from verlog.agent import judge_chat_models

    files: dict[str, GraphFile] = {}
    scorers: dict[int, RewardScorer | None] = {}
    built = {}
    for task in tasks:
        path = task.config.multi_turn.langgraph.path
        if path not in files:
            files[path] = load_graph_file(path)
        graph_file = files[path]
        model = chat_model_for(task)
        if scorer_for is not None:
            scorer = scorer_for(task)
        elif id(task.config) not in scorers:
            scorer = scorers[id(task.config)] = build_scorer(
                task.config, chat_model_for=judge_chat_models(task.config, model)
            )
        else:
            scorer = scorers[id(task.config)]
        plan = EpisodePlan(task.config, graph_file, task.split or "test", scorer=scorer)
        built[task.key] = (graph_file.build(model, **task.graph_kwargs), plan)
    return built


async def play_tasks(
    tasks: Sequence[EvalTask],
    chat_model_for: Callable[[EvalTask], Any],
    seeds: Mapping[tuple[str, str], Sequence[int]],
    *,
    concurrency: int,
    skip: Iterable[str] = (),
    specs: Mapping[tuple[str, str], str] | None = None,
    on_record: Callable[[EpisodeRecord], None] | None = None,
    max_consecutive_errors: int | None = None,
    scorer_for: Callable[[EvalTask], RewardScorer | None] | None = None,
) -> list[EpisodeRecord]:
    """Play each task's seeds (the row indices of its split, for a data task), except the episode
    ids in ``skip``; returns the new records.

    ``on_record`` is called as each episode ends (write it, advance a progress bar). With
    ``max_consecutive_errors``, that many episodes in a row ending in ``error`` (e.g. the model
    endpoint went away) stop the run with :class:`EvalError`; the records so far are kept.
    ``scorer_for(task)``: the reward section's scorer of a task (default: built from its config,
    judges with ``embedded: policy`` using the evaluated model).
    """
    graphs = _graphs(tasks, chat_model_for, scorer_for)
    skip = set(skip)
    longest = max((len(seeds[t.key]) for t in tasks), default=0)
    pending = [
        (t, seeds[t.key][i])
        for i in range(longest)
        for t in tasks
        if i < len(seeds[t.key]) and t.episode_id(seeds[t.key][i]) not in skip
    ]
    gate = asyncio.Semaphore(max(1, concurrency))
    records: list[EpisodeRecord] = []
    errors_in_a_row = 0

    async def one(task: EvalTask, seed: int) -> None:
        nonlocal errors_in_a_row
        graph, plan = graphs[task.key]
        async with gate:
            record = await play_episode(task, graph, plan, seed, spec=(specs or {}).get(task.key, ""))
        records.append(record)
        if on_record is not None:
            on_record(record)
        errors_in_a_row = errors_in_a_row + 1 if record.status == "error" else 0
        if max_consecutive_errors and errors_in_a_row >= max_consecutive_errors:
            raise EvalError(
                f"{errors_in_a_row} episodes in a row failed with an error, the last one: {record.error_line}"
            )

    running = [asyncio.ensure_future(one(t, s)) for t, s in pending]
    try:
        await asyncio.gather(*running)
    finally:
        for future in running:
            future.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return records


async def evaluate(
    config: Any,
    engine: Any,
    tokenizer: Any,
    *,
    episodes: int | None = None,
    seed: int | None = None,
    temperature: float | None = None,
    split: str = "test",
    scorer: RewardScorer | None = None,
) -> list[TaskResult]:
    """Play each of the config's eval tasks ``episodes`` times (default ``eval.episode_count``) on
    ``engine``, seeds ``seed, seed + 1, ...`` (default ``eval.seed``) — or, with a data section,
    the first rows of ``split``; what training reports.

    The temperature is ``temperature``, else ``eval.temperature``, else ``sampling.temperature``.
    A failed episode counts as not won, with the reward and progression it had reached.
    ``scorer``: the reward section's scorer (default: built from the config).
    """
    from verlog.agent import build_chat_model

    ev = config.eval
    temp = next(t for t in (temperature, ev.temperature, config.sampling.temperature) if t is not None)
    chat_model = build_chat_model(config, engine, tokenizer).model_copy(update={"temperature": temp})
    tasks = config_tasks(config, split=split)
    seeds = {t.key: episode_seeds(t, episodes, first=seed) for t in tasks}
    records = await play_tasks(
        tasks,
        lambda _task: chat_model,
        seeds,
        concurrency=ev.concurrency,
        scorer_for=(lambda _task: scorer) if scorer is not None else None,
    )
    return summarize(records, [t.key for t in tasks]).tasks


def episode_seeds(task: EvalTask, episodes: int | None = None, *, first: int | None = None) -> list[int]:
    """The episodes an evaluation plays of ``task``: ``episodes`` (default ``eval.episode_count``)
    seeds from ``first`` (default ``eval.seed``), or the first rows of the task's data split
    (each once: never more than it has)."""
    ev = task.config.eval
    if task.split is not None:
        from verlog.data import split_rows

        rows = len(split_rows(task.config, task.split))
        return list(range(min(episodes, rows) if episodes else ev.episode_count(rows)))
    start = ev.seed if first is None else first
    return list(range(start, start + (episodes or ev.episode_count())))
