"""Fixed-turn batching: ``num_envs`` persistent env slots, each giving exactly ``turns_per_env``
turns to every batch.

This is the rollout storage of pytorch-a2c-ppo-acktr-gail, for graphs. Each slot runs one
episode after another (a new seed when one ends). The graph is built around a gated engine
(``build_graph(engine)``): once a slot has given its quota of model calls to the current batch,
its next call is *held* until the trainer has updated the weights and asks for the next batch.
So an episode cut by the batch boundary simply continues, under the new weights, and the held
call's prompt is exactly the next state ``s_{t+1}`` of the cut turn: the trainer bootstraps
that turn with the critic's value of it.

A slot has reached the boundary when a call of it is held and nothing of it is still running:
the environment has already answered the quota's last call (its reward is on the turn). An
episode that ends inside the batch is followed at once by a new one in the same slot, whose
first call is then the held one (its value is not used: the finished turn bootstraps nothing).

**Sync and async nodes alike.** A ``def`` node calling ``model.invoke`` runs in a worker thread
(LangGraph does that under ``graph.ainvoke``) and its call reaches the gate from another event
loop: the gate runs every call on the runner's own loop and the worker thread parks on a
thread-safe future, so a held sync call wakes exactly like an async one. The runner gives its
loop enough worker threads for every slot to hold a call at once.

**Failed episodes.** A graph that raises, hits its ``recursion_limit`` or exceeds the episode
timeout fails its episode. Its turns in the *current* batch are dropped (the slot starts a new
episode and refills its quota, so the batch keeps its shape); turns it gave to *earlier*
batches stay trained: each was a complete transition (the environment had answered it) and the
cut one was bootstrapped from the real next prompt, so nothing trained depends on the failure.
Failures are counted; a slot failing ``max_consecutive_failures`` episodes in a row stops the
run with ``SlotFailureError``. The timeout does not run while a call is held for an update.

**Truncation.** A turn the environment reports ``truncated`` (a step cap) keeps the value of
the state after the cut: if the environment also reported ``next_messages`` (the prompt the
model would be given next), ``render_prompt`` turns them into ``Turn.next_prompt_ids`` exactly
as the chat model would; the trainer reads the critic's value there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from langchain_core.runnables import Runnable

from verlog.backends.base import Engine, Generation, SamplingParams
from verlog.graph_file import GraphFileError
from verlog.rollout.recorder import PromptRenderer, TurnRecorder
from verlog.rollout.runner import run_episode
from verlog.rollout.schedule import slot_seed
from verlog.rollout.turn import Episode, Turn

__all__ = ["SlotBatch", "SlotFailureError", "SlotRunner"]


class SlotFailureError(RuntimeError):
    """The rollout cannot go on: a slot's episodes failed ``max_consecutive_failures`` times in a
    row (a graph that always fails would otherwise loop forever). The message names the last
    failure."""


@dataclass
class SlotBatch:
    """One fixed-turn batch: ``turns[i]`` are the ``turns_per_env`` consecutive turns of slot ``i``.

    A slot's turns may span several episodes (``done`` turns end them); the first may continue
    an episode begun in an earlier batch (``starts_episode[i]`` is False then), the last may be
    cut by the boundary, to be bootstrapped from ``bootstrap_prompt_ids[i]``: the prompt of the
    slot's call held at the boundary.
    """

    turns: list[list[Turn]]
    bootstrap_prompt_ids: list[list[int]]
    starts_episode: list[bool]
    #: the seed of each turn's episode (``[num_envs][turns_per_env]``), e.g. GRPO's groups
    seeds: list[list[int]]
    #: episodes that ended (status ok) while this batch was collected
    episodes: list[Episode] = field(default_factory=list)
    #: failed episodes dropped while this batch was collected (their turns are not in ``turns``)
    failed: list[Episode] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def num_envs(self) -> int:
        return len(self.turns)

    @property
    def turns_per_env(self) -> int:
        return len(self.turns[0]) if self.turns else 0

    def flat_turns(self) -> list[Turn]:
        """All turns, slot by slot (slot-major order, time order within a slot)."""
        return [t for slot in self.turns for t in slot]


class _SlotRecorder(TurnRecorder):
    """A ``TurnRecorder`` that tells the runner whenever a call ends (a turn may be complete)."""

    def __init__(self, episode_id: str, notify: Callable[[], None], **kwargs: Any):
        super().__init__(episode_id, **kwargs)
        self._notify = notify

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        super().on_llm_end(response, **kwargs)
        self._notify()

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        super().on_llm_error(error, **kwargs)
        self._notify()

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        super().on_custom_event(name, data, **kwargs)
        self._notify()


@dataclass
class _Segment:
    """The part of one episode that belongs to the current batch."""

    slot: int
    seed: int
    recorder: _SlotRecorder
    #: turns of this episode already given to earlier batches
    start: int = 0
    #: calls of this episode let through in the current batch
    admitted: int = 0
    in_flight: int = 0
    #: the finished episode (status ok), once it has ended
    episode: Episode | None = None

    def batch_turns(self) -> list[Turn]:
        turns = self.episode.turns if self.episode is not None else self.recorder.sorted_turns()
        return turns[self.start:]


@dataclass
class _Slot:
    """One env slot: its episodes in this batch, the calls it holds, its counters."""

    index: int
    segments: list[_Segment] = field(default_factory=list)
    #: prompt ids of the calls held at the gate, in arrival order
    held: list[list[int]] = field(default_factory=list)
    reopened: asyncio.Event = field(default_factory=asyncio.Event)
    episodes_started: int = 0
    consecutive_failures: int = 0
    held_total_s: float = 0.0
    held_since: float | None = None

    @property
    def admitted(self) -> int:
        return sum(s.admitted for s in self.segments)

    def clock(self) -> float:
        """Wall time that stands still while the slot holds a call (an episode's timeout clock)."""
        now = time.perf_counter()
        held = self.held_total_s + (now - self.held_since if self.held_since is not None else 0.0)
        return now - held


class _GatedEngine(Engine):
    """The engine the slots' graph is built around: every call goes through its runner's gate.

    Calls whose ``request_id`` (the episode id the chat model sends) belongs to no running slot
    episode pass straight through (e.g. evaluation episodes sharing the engine).
    """

    def __init__(self, runner: "SlotRunner"):
        self._runner = runner
        self.eos_token_ids = runner.engine.eos_token_ids
        self.constraint_kinds = runner.engine.constraint_kinds  # constraints pass through to it

    def stop_token_ids(self, sampling: SamplingParams) -> list[int]:
        return self._runner.engine.stop_token_ids(sampling)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        return await self._runner._gated_generate(prompt_ids, sampling, request_id)

    async def aclose(self) -> None:
        await self._runner.engine.aclose()


#: the thread pool each event loop was given for the slots' sync nodes, and its size
_EXECUTORS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[concurrent.futures.ThreadPoolExecutor, int]]" = (
    weakref.WeakKeyDictionary()
)
_EXECUTORS_LOCK = threading.Lock()


def _reserve_threads(loop: asyncio.AbstractEventLoop, count: int) -> None:
    """Make ``loop``'s default executor (where LangGraph runs ``def`` nodes) at least ``count``
    threads wide beyond what earlier runners on this loop reserved: each slot may park a thread
    on a held call, and a pool narrower than the slots would stop the batch from completing."""
    with _EXECUTORS_LOCK:
        _, reserved = _EXECUTORS.get(loop, (None, 0))
        width = reserved + count
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=width + 8, thread_name_prefix="verlog-node")
        loop.set_default_executor(pool)  # the previous pool finishes its work and is collected
        _EXECUTORS[loop] = (pool, width)


class SlotRunner:
    """Runs ``num_envs`` persistent env slots of a graph and cuts fixed-turn batches.

    Args:
        engine: the inference engine that answers the slots' model calls.
        build_graph: builds the compiled graph around the engine it is given (the runner's gated
            view of ``engine``), e.g. ``lambda e: graph_file.build(VerlogChatModel(engine=e, ...))``.
        make_input: the graph input of the episode with a given seed.
        num_envs: the number of slots.
        turns_per_env: the turns each slot gives to every batch.
        graph_config: the run config of each episode (``recursion_limit``...).
        timeout_s: an episode's time limit, not counting time held at the boundary.
        seed: the first seed. Slot group ``g`` (``group_size`` consecutive slots playing the same
            seeds, e.g. GRPO groups) plays in its round ``j`` seed ``seed + j * G + (g + j) % G``
            (``G`` groups, ``verlog.rollout.schedule``): every seed is played once, and a group
            does not stay on one residue class, so seed-dependent failures spread over the slots.
        group_size: consecutive slots that play the same seeds; 1 = all differ. The slots of a
            group stay in step: a slot starting an episode joins the newest round its group has
            begun (when another slot has already begun it) rather than one its group left behind,
            so episodes of one task keep ending in the same batches (what group estimators compare).
        on_episode_end: ``await on_episode_end(episode, seed)`` once an episode has ended well,
            before its turns can be cut into a batch (e.g. reward functions adding to its turns);
            if it raises, the episode fails (its error is the exception's message).
        max_consecutive_failures: a slot failing this many episodes in a row raises
            ``SlotFailureError`` from ``collect``.
        keep_messages: keep each call's input messages on its turn.
        render_prompt: ``render_prompt(messages, tools) -> prompt ids``, the chat model's own
            rendering (``VerlogChatModel.render_prompt_ids``): turns a truncated turn's reported
            ``next_messages`` into its ``next_prompt_ids``.
    """

    def __init__(
        self,
        engine: Engine,
        build_graph: Callable[[Engine], Runnable],
        make_input: Callable[[int], Any],
        *,
        num_envs: int,
        turns_per_env: int,
        graph_config: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        seed: int = 0,
        group_size: int = 1,
        max_consecutive_failures: int = 20,
        keep_messages: bool = False,
        render_prompt: PromptRenderer | None = None,
        on_episode_end: Callable[[Episode, int], Awaitable[None]] | None = None,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if turns_per_env < 1:
            raise ValueError(f"turns_per_env must be >= 1, got {turns_per_env}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size ({group_size}) must divide num_envs ({num_envs})")
        self.engine = engine
        self.make_input = make_input
        self.num_envs, self.turns_per_env = num_envs, turns_per_env
        self.graph_config, self.timeout_s = graph_config, timeout_s
        self.seed, self.group_size = seed, group_size
        self.max_consecutive_failures = max_consecutive_failures
        self.keep_messages = keep_messages
        self.render_prompt = render_prompt
        self.on_episode_end = on_episode_end
        #: the newest round begun by each slot group
        self._newest_round: dict[int, int] = {}
        #: totals over the run (saved in checkpoints)
        self.counters: dict[str, Any] = {"batches": 0, "turns": 0, "episodes": 0, "failed": {}}
        self._slots = [_Slot(i) for i in range(num_envs)]
        self._segments: dict[str, _Segment] = {}
        #: calls that reached the gate from another event loop (sync nodes), by episode id
        self._foreign: dict[str, set[concurrent.futures.Future]] = {}
        self._foreign_lock = threading.Lock()
        self._tasks: list[asyncio.Task] = []
        self._ended: list[Episode] = []
        self._failed: list[Episode] = []
        self._error: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.graph = build_graph(_GatedEngine(self))

    # ------------------------------------------------------------------ the batch
    async def collect(self) -> SlotBatch:
        """Let every slot give ``turns_per_env`` more turns; return them once all are at the boundary."""
        started = time.perf_counter()
        if not self._tasks:
            self._start()
        else:
            self._open()
        assert self._changed is not None
        while True:
            self._changed.clear()
            if self._error is not None:
                raise self._error
            if all(self._at_boundary(slot) for slot in self._slots):
                break
            await self._changed.wait()
        batch = self._cut()
        batch.seconds = time.perf_counter() - started
        return batch

    @property
    def episodes_started(self) -> list[int]:
        """Episodes started so far by each slot (seeds go on from there after a resume)."""
        return [s.episodes_started for s in self._slots]

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        _reserve_threads(self._loop, self.num_envs)
        self._tasks = [asyncio.create_task(self._run_slot(slot)) for slot in self._slots]

    def _open(self) -> None:
        """Start a new batch: every slot may give ``turns_per_env`` calls again."""
        for slot in self._slots:
            for segment in slot.segments:
                segment.admitted = 0
            self._reopen(slot)

    @staticmethod
    def _reopen(slot: _Slot) -> None:
        reopened, slot.reopened = slot.reopened, asyncio.Event()
        reopened.set()

    def _notify(self) -> None:
        if self._loop is not None and self._changed is not None:
            self._loop.call_soon_threadsafe(self._changed.set)

    def _at_boundary(self, slot: _Slot) -> bool:
        """The slot holds a call, nothing of it runs, and its quota's turns are all recorded."""
        if not slot.held or any(s.in_flight for s in slot.segments):
            return False
        if sum(s.recorder.calls_running for s in slot.segments) > len(slot.held):
            return False  # a call past the gate has not been recorded yet
        recorded = sum(len(s.batch_turns()) for s in slot.segments)
        if recorded == slot.admitted == self.turns_per_env:
            return True
        if recorded < slot.admitted:  # a call was let through but left no turn: let another in
            slot.segments[-1].admitted -= slot.admitted - recorded
            self._reopen(slot)
        return False

    def _cut(self) -> SlotBatch:
        """Take each slot's quota of turns; keep only the episodes still running."""
        turns, bootstrap, starts, seeds = [], [], [], []
        for slot in self._slots:
            slot_turns: list[Turn] = []
            slot_seeds: list[int] = []
            for segment in slot.segments:
                part = segment.batch_turns()
                slot_turns += part
                slot_seeds += [segment.seed] * len(part)
            assert len(slot_turns) == self.turns_per_env, (slot.index, len(slot_turns))
            starts.append(slot.segments[0].start == 0)
            running = [s for s in slot.segments if s.episode is None]
            for segment in running:
                segment.start += len(segment.batch_turns())
            slot.segments = running
            turns.append(slot_turns)
            seeds.append(slot_seeds)
            bootstrap.append(list(slot.held[0]))
        batch = SlotBatch(turns, bootstrap, starts, seeds, episodes=self._ended, failed=self._failed)
        self._ended, self._failed = [], []
        self.counters["batches"] += 1
        self.counters["turns"] += self.num_envs * self.turns_per_env
        return batch

    # ------------------------------------------------------------------ the gate
    async def _gated_generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None) -> Generation:
        """A model call of the slots' graph: on the runner's loop, held past the slot's quota."""
        home = self._loop
        if home is not None and asyncio.get_running_loop() is not home:
            # a sync node's call (its own loop, in a worker thread): run it on the runner's loop
            future = asyncio.run_coroutine_threadsafe(self._admit(prompt_ids, sampling, request_id), home)
            self._track_foreign(request_id, future)
            return await asyncio.wrap_future(future)
        return await self._admit(prompt_ids, sampling, request_id)

    def _track_foreign(self, episode_id: str | None, future: concurrent.futures.Future) -> None:
        if episode_id is None:
            return
        with self._foreign_lock:
            self._foreign.setdefault(episode_id, set()).add(future)

        def forget(done: concurrent.futures.Future) -> None:
            with self._foreign_lock:
                self._foreign.get(episode_id, set()).discard(done)

        future.add_done_callback(forget)

    def _cancel_foreign(self, episode_id: str) -> None:
        """Stop the calls a finished (e.g. timed-out) episode's sync nodes still wait on."""
        with self._foreign_lock:
            futures = self._foreign.pop(episode_id, set())
        for future in futures:
            future.cancel()

    async def _admit(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None) -> Generation:
        segment = self._segments.get(request_id) if request_id is not None else None
        if segment is None:
            return await self.engine.generate(prompt_ids, sampling, request_id=request_id)
        slot = self._slots[segment.slot]
        while slot.admitted >= self.turns_per_env:
            await self._hold(slot, prompt_ids)
        segment.admitted += 1
        segment.in_flight += 1
        try:
            return await self.engine.generate(prompt_ids, sampling, request_id=request_id)
        except BaseException:
            segment.admitted -= 1  # no turn came of it
            raise
        finally:
            segment.in_flight -= 1
            self._notify()

    async def _hold(self, slot: _Slot, prompt_ids: list[int]) -> None:
        """Wait at the boundary until the next batch opens; the prompt is on show meanwhile."""
        entry = list(prompt_ids)
        reopened = slot.reopened
        slot.held.append(entry)
        if slot.held_since is None:
            slot.held_since = time.perf_counter()
        self._notify()
        try:
            await reopened.wait()
        finally:
            slot.held.remove(entry)
            if not slot.held and slot.held_since is not None:
                slot.held_total_s += time.perf_counter() - slot.held_since
                slot.held_since = None

    # ------------------------------------------------------------------ the slots
    def _next_seed(self, slot: _Slot) -> int:
        """The seed of the slot's next episode: its next round, or its group's newest round when
        another slot of the group has begun that one already (the group stays in step)."""
        groups = self.num_envs // self.group_size
        group, j = slot.index // self.group_size, slot.episodes_started
        if self.group_size > 1:
            j = max(j, self._newest_round.get(group, -1))
            self._newest_round[group] = j
        slot.episodes_started = j + 1
        return slot_seed(self.seed, j, group, groups)

    async def _run_slot(self, slot: _Slot) -> None:
        """Play episodes in ``slot`` forever (until cancelled)."""
        while True:
            seed = self._next_seed(slot)
            episode_id = f"slot{slot.index}-ep{slot.episodes_started - 1}"
            recorder = _SlotRecorder(
                episode_id, self._notify, keep_messages=self.keep_messages, render_prompt=self.render_prompt
            )
            segment = _Segment(slot.index, seed, recorder)
            slot.segments.append(segment)
            self._segments[episode_id] = segment
            try:
                graph_input = self.make_input(seed)
            except GraphFileError as exc:  # the graph file cannot start episodes at all
                self._stop(exc)
                return
            except Exception as exc:  # make_input failed for this seed: a failed episode
                episode = recorder.episode("error", error=f"make_input({seed}) failed: {exc!r}")
            else:
                try:
                    episode = await run_episode(
                        self.graph, graph_input, episode_id=episode_id, graph_config=self.graph_config,
                        timeout_s=self.timeout_s, recorder=recorder, clock=slot.clock,
                    )
                finally:
                    self._cancel_foreign(episode_id)
                if self.on_episode_end is not None and not episode.failed and episode.turns:
                    try:
                        await self.on_episode_end(episode, seed)
                    except Exception as exc:  # e.g. a reward function failed: never a made-up reward
                        failed = recorder.episode("error", error=str(exc) or type(exc).__name__)
                        failed.seconds, episode = episode.seconds, failed
            self._segments.pop(episode_id, None)  # its calls no longer pass the gate
            if episode.failed or not episode.turns:
                slot.segments.remove(segment)  # its turns in this batch are dropped
                self._failed.append(episode)
                status = episode.status if episode.failed else "empty"
                self.counters["failed"][status] = self.counters["failed"].get(status, 0) + 1
                slot.consecutive_failures += 1
                if slot.consecutive_failures >= self.max_consecutive_failures:
                    last = (episode.error or "").strip().splitlines()
                    self._stop(SlotFailureError(
                        f"slot {slot.index} failed {slot.consecutive_failures} episodes in a row "
                        f"(max_consecutive_failures); last (seed {seed}): {episode.status}: "
                        f"{last[0] if last else 'no error message'}"
                    ))
                    return
            else:
                segment.episode = episode
                slot.consecutive_failures = 0
                self._ended.append(episode)
                self.counters["episodes"] += 1
            self._notify()

    def _stop(self, error: BaseException) -> None:
        self._error = error
        self._notify()

    # ------------------------------------------------------------------ lifecycle
    def state_dict(self) -> dict[str, Any]:
        """Counters to resume from: episodes started per slot (seeds go on) and run totals."""
        return {
            "episodes_started": self.episodes_started,
            "counters": {**self.counters, "failed": dict(self.counters["failed"])},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters before the first ``collect`` (episodes in flight are not saved: each
        slot starts a new episode with its next seed)."""
        if self._tasks:
            raise RuntimeError("load_state_dict must come before the first collect()")
        started = [int(n) for n in state["episodes_started"]]
        if len(started) != self.num_envs:
            raise ValueError(f"state has {len(started)} slots, runner has {self.num_envs}")
        for slot in self._slots:  # the slots of a group start in step, on a round none has begun
            first = slot.index - slot.index % self.group_size
            slot.episodes_started = max(started[first:first + self.group_size])
        counters = state["counters"]
        self.counters = {**counters, "failed": dict(counters.get("failed", {}))}

    async def aclose(self) -> None:
        """Stop every slot (episodes in flight are cancelled)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for episode_id in list(self._foreign):
            self._cancel_foreign(episode_id)
