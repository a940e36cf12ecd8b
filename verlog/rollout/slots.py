"""Fixed-turn batching: ``num_envs`` persistent env slots, each giving exactly ``turns_per_env``
turns to every batch.

This is the rollout storage of pytorch-a2c-ppo-acktr-gail, for graphs. Each slot runs one
episode after another (a new seed when one ends). The graph is built around a gated engine
(``build_graph(engine)``): once a slot has given its quota of model calls to the current batch,
its next call is *held* until the trainer has updated the weights and asks for the next batch.
So an episode cut by the batch boundary simply continues, under the new weights, and the held
call's prompt is exactly the next state ``s_{t+1}`` of the cut turn: the trainer bootstraps
that turn with the critic's value of it.

**Turns belong to batches by identity.** The gate and the recorder both know each call by its
LangChain run id (``VerlogChatModel`` hands it to the engine, ``engine_call_run``): a call is
counted against its slot's quota when the gate *admits* it, and its turn goes to the batch that
admitted it, whatever order parallel branches (``Send``, ``batch``, ``asyncio.gather``) start,
finish or are held in. A slot has reached the boundary when its quota's calls are all recorded
(the environment has answered the last one: its reward is on the turn) and every other call of
it that has started is held; the prompt of the held call that started first is the bootstrap.
Once a batch is cut the gate admits nothing until the next one opens, so a call that starts
during the update or an evaluation (a branch that called late) waits for the next batch. An
episode that ends inside the batch is followed at once by a new one in the same slot, whose
first call is then the held one (its value is not used: the finished turn bootstraps nothing).
A call tagged ``NO_TRAIN_TAG`` (a judge reusing the policy model) is never counted, held or
trained. A training call answered without passing the gate (a LangChain cache, a model not
built on the gated engine) would be silently untrained: it stops the run instead.

**Sync and async nodes alike.** The runner's bookkeeping, the gate and the engine live on the
runner's own event loop. By default (``slot_threads="auto"``) the episodes run there too: a call
from an ``async def`` node reaches the gate with no thread hop (on ``make run``'s config the
rollout of a batch took 2.0 s instead of 3.1 s with a thread per slot), and a ``def`` node runs in
a worker thread (the loop's default executor, a :class:`~verlog.rollout.outside_calls.NodeExecutor`
widened by ``NODE_THREADS`` per slot) whose call parks the thread on a thread-safe future while it
runs on the runner's loop (``Engine.sync_loop``). A blocking call inside an ``async def`` node
(``model.invoke``, ``model.stream``, ``model.batch``, as production graphs may make) would block
the very loop that must answer it: it is refused there, its episode is played again from its start
(its turns in this batch are dropped, not counted as a failure; with whole groups its row is), and
from then on each slot's episodes run on a loop of their own, in a thread of their own
(:class:`~verlog.rollout.graph_loop.GraphLoop`), where such a call parks its slot's thread as it
would block its own run in production (``slot_threads="always"`` starts that way: for graphs
whose ``async def`` nodes block their loop with other work, e.g. ``time.sleep``, which on the
runner's loop would stall every slot). Either way a held call of any style wakes exactly like the
others, and a slot blocked at the boundary never keeps another from reaching it.

**Failed episodes.** A graph that raises, hits its ``recursion_limit`` or exceeds the episode
timeout fails its episode. Its turns in the *current* batch are dropped (the slot starts a new
episode and refills its quota, so the batch keeps its shape); turns it gave to *earlier*
batches stay trained: each was a complete transition (the environment had answered it) and the
cut one was bootstrapped from the real next prompt, so nothing trained depends on the failure.
Failures are counted; a slot failing ``max_consecutive_failures`` episodes in a row stops the
run with ``SlotFailureError``. The timeout counts the graph's own time only: it does not run
while a model call is under way (queued, generating, or held for an update).

**Whole groups.** With ``whole_groups`` (group estimators), the ``group_size`` slots of a group
play each row together: the group's next row starts once all its plays have ended, a slot whose
play ended first waiting idle (at the boundary, it gives fewer than ``turns_per_env`` turns). A
group is compared only if all its plays began and ended well in one batch
(``SlotBatch.compared``); one that straddles a boundary or loses a play is dropped whole and its
row played again (see ``SlotRunner``).

**Discarded attempts, interrupts.** A call made in a node attempt that then raised (a
``RetryPolicy`` retry) leaves the episode's turns (``TurnRecorder``): its place in the batch is
given back and refilled (such a turn already cut into an earlier batch, only possible when a
parallel branch reached the boundary meanwhile, stays trained). An episode that stops at an
unanswered ``interrupt()`` fails like any other (status ``interrupted``); with ``interrupts`` (an
:class:`~verlog.rollout.interrupts.InterruptResponder`) it is answered and goes on in its slot,
every call after the answer gated and trained as usual.

**Truncation.** A turn the environment reports ``truncated`` (a step cap) keeps the value of
the state after the cut: if the environment also reported ``next_messages`` (the prompt the
model would be given next), ``render_prompt`` turns them into ``Turn.next_prompt_ids`` exactly
as the chat model would; the trainer reads the critic's value there.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable
from uuid import UUID

from langchain_core.runnables import Runnable

from verlog.backends.base import BlockingCallError, Engine, Generation, ImageInputs, SamplingParams
from verlog.config import SLOT_THREADS, SlotThreads
from verlog.graph_file import GraphFileError
from verlog.llm.chat_model import engine_call_run
from verlog.rollout.graph_loop import NODE_THREADS, GraphLoop
from verlog.rollout.interrupts import InterruptResponder
from verlog.rollout.outside_calls import NodeExecutor, widen_node_executor
from verlog.rollout.recorder import RenderPrompt, TurnRecorder, active_recorder
from verlog.rollout.runner import run_episode
from verlog.rollout.schedule import slot_seed
from verlog.rollout.turn import Episode, Turn

__all__ = ["GROUP_ATTEMPTS", "SlotBatch", "SlotCounters", "SlotFailureError", "SlotRunner"]

#: with whole groups: how many times a slot group plays a row it could not play whole (it straddled
#: a batch boundary, or a play failed) before it gives the row up for this epoch
GROUP_ATTEMPTS = 3

#: with whole groups: how many of a group's latest rows its next row's length is judged by (the
#: longest play among them): an outlier long play slows the group down for a while, not for good
_ROWS_REMEMBERED = 8


class SlotFailureError(RuntimeError):
    """The rollout cannot go on: a slot's episodes failed ``max_consecutive_failures`` times in a
    row (a graph that always fails would otherwise loop forever; the message names the last
    failure), or the graph's code can never train (a training call answered without passing the
    gate, a sync call an engine refuses with ``BlockingCallError``)."""


@dataclass
class SlotBatch:
    """One fixed-turn batch: ``turns[i]`` are the ``turns_per_env`` consecutive turns of slot ``i``.

    A slot's turns may span several episodes (``done`` turns end them); the first may continue
    an episode begun in an earlier batch (``starts_episode[i]`` is False then), the last may be
    cut by the boundary, to be bootstrapped from ``bootstrap_prompt_ids[i]``: the prompt of the
    slot's call held at the boundary. With whole groups a slot that waited for its group-mates
    gives fewer turns (at most ``turns_per_env``), its last one done (its bootstrap prompt is
    then empty), and ``compared`` says which turns a group estimator may compare.
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
    #: the images of each slot's held prompt (base64 files, as ``Turn.images``; ``[]``: none anywhere)
    bootstrap_images: list[tuple[str, ...]] = field(default_factory=list)
    #: with whole groups (``SlotRunner(whole_groups=True)``): per turn (``[num_envs][len(turns[i])]``),
    #: whether its play belongs to a group whose ``group_size`` plays all began and ended in this
    #: batch, the only plays a group estimator may compare; ``None``: no such promise
    compared: list[list[bool]] | None = None
    #: with whole groups: the episodes of each group played whole in this batch, one list per group
    whole_groups: list[list[Episode]] = field(default_factory=list)
    #: with whole groups: groups whose last play ended in this batch but that were not played whole
    #: (they straddled a batch boundary, or a play failed): none of their plays is compared
    groups_dropped: int = 0
    #: the slots' time waiting at the boundary for this batch to be cut: the mean over slots of the
    #: seconds between a slot giving its share (quota, or cap with stragglers) and the cut, and the most
    boundary_wait_s: float = 0.0
    boundary_wait_max_s: float = 0.0
    #: the runner's :meth:`SlotRunner.state_dict` at the cut (what a checkpoint after training this
    #: batch resumes from: later batches' episodes are played again); ``None``: not a live batch
    runner_state: dict[str, Any] | None = None

    @property
    def num_envs(self) -> int:
        return len(self.turns)

    @property
    def turns_per_env(self) -> int:
        """The most turns a slot gave (every slot gives as many, except with whole groups: a slot
        waiting for its group-mates gives fewer)."""
        return max((len(slot) for slot in self.turns), default=0)

    def flat_turns(self) -> list[Turn]:
        """All turns, slot by slot (slot-major order, time order within a slot)."""
        return [t for slot in self.turns for t in slot]

    @property
    def discarded_calls(self) -> int:
        """Calls made in attempts that then raised (a node retried by a ``RetryPolicy``...) in the
        episodes that ended or failed while this batch was collected: not trained (unless the
        runner keeps them)."""
        return sum(e.discarded_calls for e in (*self.episodes, *self.failed))

    @property
    def uncaptured_calls(self) -> int:
        """Calls of chat models without verlog's token data in the episodes that ended or failed
        while this batch was collected: they are not trained."""
        return sum(e.uncaptured_calls for e in (*self.episodes, *self.failed))

    @property
    def ragged(self) -> bool:
        """Whether the slots gave different numbers of turns (stragglers, whole groups)."""
        return len({len(slot) for slot in self.turns}) > 1

    def slot_images(self) -> list[tuple[str, ...]]:
        """:attr:`bootstrap_images`, one entry per slot (``()`` where none)."""
        return list(self.bootstrap_images) or [() for _ in self.bootstrap_prompt_ids]


class _SlotRecorder(TurnRecorder):
    """A ``TurnRecorder`` that tells its runner when a training call starts and when it ends, on
    the runner's loop whichever thread LangChain calls it from."""

    def __init__(self, episode_id: str, runner: "SlotRunner", **kwargs: Any):
        super().__init__(episode_id, **kwargs)
        self._runner = runner
        #: ids of this episode's turns already cut into a batch
        self.cut_turns: set[int] = set()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        index = self._start(run_id, messages, tags, metadata, kwargs)
        if index is not None:
            self._runner._on_loop(self._runner._call_started, self.episode_id, run_id, index)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        trained, turn = self._finish(run_id, response)
        if trained:
            self._runner._on_loop(self._runner._call_ended, run_id, turn)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        super().on_llm_error(error, run_id=run_id, **kwargs)
        self._runner._on_loop(self._runner._call_ended, run_id, None)

    def _preferred(self, turn: Turn) -> bool:
        # parallel calls of one step may straddle a batch boundary: their reward goes to one not yet
        # trained (else the batch that trained it has lost it), by the same rule among those
        return id(turn) not in self.cut_turns

    def _on_discarded(self, turn: Turn) -> None:
        self._runner._on_loop(self._runner._discard_turn, self.episode_id, turn)

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        turn = self._reward(name, data, run_id)
        if (
            turn is not None
            and id(turn) in self.cut_turns
            and (data["reward"] or data.get("terminated") or data.get("truncated"))
        ):
            self._runner._on_loop(self._runner._late_reward, self.episode_id)


@dataclass
class _Segment:
    """One episode of a slot, while it has turns to give to the current batch."""

    slot: int
    seed: int
    recorder: _SlotRecorder
    #: turns of this episode already given to earlier batches
    given: int = 0
    #: the finished episode (status ok), once it has ended
    episode: Episode | None = None
    #: with whole groups: the group's attempt at a row this episode is one play of
    row: "_Row | None" = None
    #: the start index of its newest training call (a call before it has had its answer from the
    #: environment: the graph went on to the next call)
    last_started: int = -1
    #: it made a blocking call on the runner's loop: it is played again on its slot's thread
    moved: bool = False


@dataclass(eq=False)
class _Call:
    """A training call of a slot's episode, from its start to its turn."""

    segment: _Segment
    #: start order in its episode (its turn's index)
    index: int
    #: the batch that admitted it (``None``: not admitted yet)
    batch: int | None = None
    #: while held at the gate: its prompt (the bootstrap state if it is the slot's first held call)
    prompt_ids: list[int] | None = None
    #: ... and its prompt's images (base64 files; ``()``: none)
    prompt_images: tuple[str, ...] = ()
    #: the task waiting at the gate or on the engine (cancelled if its episode ends first)
    task: asyncio.Task | None = None
    turn: Turn | None = None
    #: the weights' version (``SlotRunner.policy_version``) when the gate admitted it
    version: int | None = None
    #: once admitted: its prompt and images (with stragglers, the bootstrap of the turn before it)
    admitted_prompt: tuple[list[int], tuple[str, ...]] | None = None


@dataclass
class SlotCounters:
    """A slot runner's totals over the run (saved in checkpoints as a plain dict)."""

    #: batches collected
    batches: int = 0
    #: turns given to batches
    turns: int = 0
    #: episodes that ended well
    episodes: int = 0
    #: episodes dropped, by how they failed (``error``, ``timeout``, ``empty`` ...)
    failed: dict[str, int] = field(default_factory=dict)
    #: rewards reported for a turn already cut into a batch (see ``SlotRunner._late_reward``)
    late_rewards: int = 0
    #: with whole groups: attempts at a row not played whole (left out of the loss, played again)
    groups_dropped: int = 0
    #: with whole groups: rows given up after ``GROUP_ATTEMPTS`` attempts, or whose plays are longer
    #: than a batch (never compared this epoch)
    groups_abandoned: int = 0
    #: episodes played again on their slot's thread after a blocking model call on the runner's
    #: loop (``slot_threads="auto"``), and their answered calls left untrained (not yet in a batch)
    moved: int = 0
    moved_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # a copy: ``failed`` included

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlotCounters:
        """The counters :meth:`as_dict` wrote (``TypeError``/``ValueError`` for anything else)."""
        if not isinstance(data, dict) or not isinstance(data.get("failed") or {}, dict):
            raise TypeError(f"slot counters are a dict with a 'failed' dict (got {type(data).__name__})")
        return cls(
            batches=int(data.get("batches", 0)),
            turns=int(data.get("turns", 0)),
            episodes=int(data.get("episodes", 0)),
            failed={str(k): int(v) for k, v in (data.get("failed") or {}).items()},
            late_rewards=int(data.get("late_rewards", 0)),
            groups_dropped=int(data.get("groups_dropped", 0)),
            groups_abandoned=int(data.get("groups_abandoned", 0)),
            moved=int(data.get("moved", 0)),
            moved_calls=int(data.get("moved_calls", 0)),
        )


@dataclass
class _Slot:
    """One env slot: its episodes in this batch, its calls, its counters."""

    index: int
    segments: list[_Segment] = field(default_factory=list)
    #: training calls started and not ended (on their way to the gate, held, or generating)
    running: set[_Call] = field(default_factory=set)
    #: calls admitted into the batch being collected (at most ``turns_per_env``)
    batch_calls: list[_Call] = field(default_factory=list)
    #: calls held at the gate, in arrival order
    held: list[_Call] = field(default_factory=list)
    reopened: asyncio.Event = field(default_factory=asyncio.Event)
    episodes_started: int = 0
    consecutive_failures: int = 0
    #: the round of the episode the slot plays now (``None`` before its first)
    current_round: int | None = None
    #: after a resume: the round to play first, the one in flight when the checkpoint was saved
    replay_round: int | None = None
    #: with whole groups: waiting for its group's next row (its play has ended, or none began yet)
    waiting: bool = False
    #: with whole groups: the row its group has just given it, until it starts playing it
    next_row: "_Row | None" = None
    #: set when ``next_row`` is given
    assigned: asyncio.Event = field(default_factory=asyncio.Event)
    #: with stragglers: how many of ``batch_calls``, in order, are complete turns (last counted)
    complete: int = 0

    def in_flight(self) -> int | None:
        """The round of the episode still running in this slot, ``None`` when none is."""
        running = any(segment.episode is None for segment in self.segments)
        return self.current_round if running else None

    @property
    def idle(self) -> bool:
        """Waiting for its group with nothing to play (whole groups): it gives no turn meanwhile."""
        return self.waiting and self.next_row is None


@dataclass(eq=False)
class _Row:
    """One attempt of a slot group at a row: its ``group_size`` plays, started together."""

    group: int
    round: int
    attempt: int
    seed: int
    #: the plays' episodes, as they start
    plays: list[_Segment] = field(default_factory=list)
    #: plays that have ended, well or not
    ended: int = 0
    #: a batch was cut while a play was still running: the plays do not all lie in one batch
    straddled: bool = False
    #: a play failed (its turns are dropped): the group is short of a play
    spoiled: bool = False
    #: a play made more model calls than a slot gives a batch: no attempt can fit in one
    too_long: bool = False
    #: the most model calls one of its plays that ended well made
    longest: int = 0

    @property
    def whole(self) -> bool:
        """Every play began and ended well in the batch the row began in."""
        return not (self.straddled or self.spoiled)


@dataclass
class _Group:
    """A slot group playing whole groups: its row now, the rows it plays again, its next round."""

    index: int
    slots: list[_Slot]
    row: _Row | None = None
    #: rows not played whole, to play again first: ``(round, attempt)``
    replays: deque[tuple[int, int]] = field(default_factory=deque)
    #: the next round it has not begun
    next_round: int = 0
    #: the most model calls a play made, in each of the group's latest rows
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=_ROWS_REMEMBERED))

    @property
    def longest(self) -> int:
        """The turns its next row is expected to need in each slot: its latest rows' longest play."""
        return max(self.lengths, default=1)

    @property
    def playing(self) -> bool:
        """Whether a play of its row is still running."""
        return self.row is not None and self.row.ended < len(self.slots)


class _GatedEngine(Engine):
    """The engine the slots' graph is built around: every call goes through its runner's gate,
    on the runner's loop (sync calls too: :meth:`sync_loop`).

    Requests of calls no slot's recorder is training on (evaluation episodes sharing the engine,
    calls tagged ``NO_TRAIN_TAG``) pass straight through.
    """

    def __init__(self, runner: "SlotRunner"):
        self._runner = runner
        self.eos_token_ids = runner.engine.eos_token_ids
        self.constraint_kinds = runner.engine.constraint_kinds  # constraints pass through to it
        self.accepts_images = runner.engine.accepts_images  # and images

    def stop_token_ids(self, sampling: SamplingParams) -> list[int]:
        return self._runner.engine.stop_token_ids(sampling)

    def sync_loop(self) -> asyncio.AbstractEventLoop | None:
        runner = self._runner
        if runner._loop is not None and threading.get_ident() == runner._loop_thread:
            runner._blocking_call()  # a sync call on the runner's own loop: refused, its episode moves
        return runner._loop or runner.engine.sync_loop()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> Generation:
        return await self._runner._gated_generate(prompt_ids, sampling, request_id, images)

    async def aclose(self) -> None:
        await self._runner.engine.aclose()


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
        group_size: consecutive slots that play the same seeds; 1 = all differ. Without
            ``whole_groups`` the slots of a group stay in step loosely: a slot starting an episode
            joins the newest round its group has begun (when another slot has already begun it)
            rather than one its group left behind, so episodes of one task mostly end in the same
            batches (no promise: plays of different lengths drift apart).
        whole_groups: make every group compared a whole one (for group estimators): the slots of a
            group start a row together, and the group's next row starts only once all its plays
            have ended (a slot whose play ended waits idle meanwhile, giving no turns: such a slot
            gives fewer than ``turns_per_env`` turns to the batch), and only when each of its slots
            has as many turns left in the batch as the longest play of the group's latest rows
            (else at the next batch, with a full quota). ``SlotBatch.compared`` marks the plays of groups
            that began and ended in the batch; a group that straddles a boundary or loses a play
            to a failure is dropped whole (``SlotBatch.groups_dropped``) and its row is played
            again, at most ``GROUP_ATTEMPTS`` times in all (a row whose plays make more model
            calls than ``turns_per_env`` is given up at once: no batch can hold it).
        on_episode_end: ``await on_episode_end(episode, seed)`` once an episode has ended well,
            before its turns can be cut into a batch (e.g. reward functions adding to its turns);
            if it raises, the episode fails (its error is the exception's message).
        max_consecutive_failures: a slot failing this many episodes in a row raises
            ``SlotFailureError`` from ``collect``.
        keep_messages: keep each call's input messages on its turn.
        render_prompt: ``render_prompt(messages, tools) -> prompt ids``, the chat model's own
            rendering (``VerlogChatModel.render_prompt_ids``): turns a truncated turn's reported
            ``next_messages`` into its ``next_prompt_ids``.
        interrupts: answers the graph's ``interrupt()`` pauses (``None``: a paused episode fails,
            status ``interrupted``).
        keep_discarded: also train the calls made in attempts that then raised.
        sampling_seed: the seed of the slots' sampling (the trainer gives ``rollout.seed``):
            each call without a seed of its own samples with one derived from it, the episode's
            id (its slot and the slot's episode counter, which a resumed run goes on from) and
            the call's place in the episode (:mod:`verlog.llm.call_seeds`), so the slots draw the
            same tokens whatever order their calls reach the engine in, and the slots of a group,
            playing one task, still draw apart. ``None``: calls sample from the engine's own
            randomness (as in verl's agent loop, whose one-slot runners would all share ids).
        max_turns_per_env: straggler-tolerant batches (``None``: off): a batch is cut once
            ``num_envs x turns_per_env`` turns are complete (the environment has answered each: its
            episode has made its next call, or ended), from any slots, each slot giving at most this
            many; a slot's turns are taken in order, and those not complete at the cut (a slow tool,
            a call still generating) go to the next batch, bootstrapped from the prompt of the call
            after the slot's last taken turn. So a slow slot gives fewer turns to this batch and
            no slot waits for it. Not with ``whole_groups``.
        slot_threads: where the episodes run (see the module's docstring): ``"auto"`` on the
            runner's own loop until an episode makes a blocking model call in an ``async def``
            node, then each slot on a thread of its own; ``"always"`` each slot on a thread of its
            own from the start. A loop whose default executor is not verlog's runs them on threads.

    Each call's turn records ``policy_version``: the runner's :attr:`policy_version` (the updates
    the trainer has published to the engine) when the gate admitted it.
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
        whole_groups: bool = False,
        max_consecutive_failures: int = 20,
        keep_messages: bool = False,
        render_prompt: RenderPrompt | None = None,
        on_episode_end: Callable[[Episode, int], Awaitable[None]] | None = None,
        interrupts: InterruptResponder | None = None,
        keep_discarded: bool = False,
        sampling_seed: int | None = None,
        max_turns_per_env: int | None = None,
        slot_threads: SlotThreads = "auto",
    ):
        if slot_threads not in SLOT_THREADS:
            raise ValueError(f"slot_threads must be one of {list(SLOT_THREADS)}, got {slot_threads!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if turns_per_env < 1:
            raise ValueError(f"turns_per_env must be >= 1, got {turns_per_env}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size ({group_size}) must divide num_envs ({num_envs})")
        if max_turns_per_env is not None and (max_turns_per_env < turns_per_env or whole_groups):
            raise ValueError(
                f"max_turns_per_env ({max_turns_per_env}) must be >= turns_per_env ({turns_per_env}), "
                "and straggler-tolerant batches do not play whole groups"
            )
        self.engine = engine
        self.make_input = make_input
        self.num_envs, self.turns_per_env = num_envs, turns_per_env
        self.graph_config, self.timeout_s = graph_config, timeout_s
        self.seed, self.group_size = seed, group_size
        self.whole_groups = whole_groups
        self.max_consecutive_failures = max_consecutive_failures
        self.keep_messages = keep_messages
        self.render_prompt = render_prompt
        self.on_episode_end = on_episode_end
        self.interrupts = interrupts
        self.keep_discarded = keep_discarded
        self.sampling_seed = sampling_seed
        self.max_turns_per_env = max_turns_per_env
        self.slot_threads = slot_threads
        #: the weights' version the engine serves, in updates (the trainer sets it when it publishes
        #: new weights); each turn records the one its call was admitted under
        self.policy_version = 0
        #: the most calls a slot may have admitted into the batch being collected
        self._share = max_turns_per_env or turns_per_env
        #: when each slot first reached the boundary of the batch being collected (``None``: not yet)
        self._reached: list[float | None] = [None] * num_envs
        #: with stragglers: slots whose calls changed since their complete turns were last counted
        self._dirty: set[int] = set(range(num_envs))
        #: the newest round begun by each slot group
        self._newest_round: dict[int, int] = {}
        #: totals over the run (saved in checkpoints)
        self.counters = SlotCounters()
        self._slots = [_Slot(i) for i in range(num_envs)]
        #: with whole groups: each slot group's rows
        self._groups = (
            [_Group(g, self._slots[g * group_size : (g + 1) * group_size]) for g in range(num_envs // group_size)]
            if whole_groups
            else []
        )
        #: with whole groups: groups played whole, and dropped, while this batch was collected
        self._whole: list[list[Episode]] = []
        self._dropped = 0
        self._warned_abandoned = False
        self._segments: dict[str, _Segment] = {}
        #: training calls of running episodes, by LangChain run id (the gate's and the recorder's key)
        self._calls: dict[UUID, _Call] = {}
        #: the batch being collected, and whether the gate admits calls into it (not once it is cut)
        self._batch = 0
        self._accepting = True
        self._warned_uncaptured = False
        self._warned_paused = False
        self._tasks: list[asyncio.Task] = []
        self._ended: list[Episode] = []
        self._failed: list[Episode] = []
        self._error: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closed = False
        #: whether new episodes run on the runner's own loop (else each slot's on its GraphLoop;
        #: see the module's docstring)
        self._inline = False
        #: the runner's loop's default executor, widened for the slots' ``def`` nodes while inline
        self._node_executor: NodeExecutor | None = None
        self._graph_loops: list[GraphLoop] = []
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
            now, ready = time.perf_counter(), True
            for slot in self._slots:  # (each slot's time at the boundary is reported)
                if not self._at_boundary(slot):
                    self._reached[slot.index], ready = None, False
                elif self._reached[slot.index] is None:
                    self._reached[slot.index] = now
            plan = self._straggler_plan() if self.max_turns_per_env is not None else None
            if plan is not None or (ready and self.max_turns_per_env is None):
                break
            await self._changed.wait()
        cut_at = time.perf_counter()
        waits = [cut_at - t if t is not None else 0.0 for t in self._reached]
        batch = self._cut(plan)
        batch.seconds = cut_at - started
        batch.boundary_wait_s, batch.boundary_wait_max_s = sum(waits) / len(waits), max(waits)
        return batch

    def hold(self) -> None:
        """Admit no more calls until the next :meth:`collect` (a batch being collected is left
        uncut: e.g. the training ends while a batch was played ahead)."""
        self._accepting = False

    @property
    def episodes_started(self) -> list[int]:
        """Episodes started so far by each slot (seeds go on from there after a resume)."""
        return [s.episodes_started for s in self._slots]

    @property
    def highest_task(self) -> int | None:
        """The highest task (a seed, or a training row's index) an episode has started with so far;
        ``None`` before the first episode."""
        groups = self.num_envs // self.group_size
        begun = [
            slot_seed(self.seed, s.episodes_started - 1, s.index // self.group_size, groups)
            for s in self._slots
            if s.episodes_started
        ]
        return max(begun, default=None)

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._changed = asyncio.Event()
        if self.slot_threads == "auto":
            self._node_executor = widen_node_executor(self._loop, NODE_THREADS * self.num_envs)
        self._inline = self._node_executor is not None
        if not self._inline:
            self._use_threads()
        self._tasks = [asyncio.create_task(self._run_slot(slot)) for slot in self._slots]

    def _use_threads(self) -> None:
        """From now on each slot's new episodes run on a loop and thread of their own."""
        self._inline = False
        if not self._graph_loops:
            self._graph_loops = [GraphLoop(f"verlog-slot{slot.index}") for slot in self._slots]

    def _blocking_call(self) -> None:
        """A sync model call on the runner's own loop: from an episode running there, its ``async
        def`` node blocks the loop that must answer the call. The call is refused (``run_sync``);
        the episode is marked to be played again, and every slot moves to threads of its own."""
        recorder = active_recorder()
        segment = self._segments.get(recorder.episode_id) if recorder is not None else None
        if segment is None:  # not a slot's episode (its model's calls are refused as before)
            return
        segment.moved = True
        if self._inline:
            self._use_threads()
            warnings.warn(
                f"episode {recorder.episode_id} made a blocking model call (model.invoke, stream or batch) in an "
                "async def node: it is played again, and every slot's episodes now run on a thread of their own "
                "(about 1 ms more a turn); await model.ainvoke there instead, or set rollout.slot_threads: always",
                RuntimeWarning,
                stacklevel=2,
            )

    def _open(self) -> None:
        """Start a new batch: every slot may give ``turns_per_env`` calls again."""
        self._batch += 1
        self._accepting = True
        self._reached = [None] * self.num_envs
        for slot in self._slots:
            self._reopen(slot)
        for group in self._groups:  # groups that waited for this batch's quota start their row
            self._schedule(group)

    @staticmethod
    def _reopen(slot: _Slot) -> None:
        """Wake the slot's held calls: each one checks again whether it may go."""
        reopened, slot.reopened = slot.reopened, asyncio.Event()
        reopened.set()

    def _notify(self) -> None:
        """Wake ``collect`` to look at the slots again (on the runner's loop: at once, no thread hop)."""
        if self._loop is not None and self._changed is not None:
            if threading.get_ident() == self._loop_thread:
                self._changed.set()
            else:
                self._loop.call_soon_threadsafe(self._changed.set)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the runner's loop: now if this is its thread, else next (in order)."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        elif self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed: the run is over
                pass

    def _at_boundary(self, slot: _Slot) -> bool:
        """The slot's quota is admitted and recorded, and every call of it still running is held:
        none is generating, none is on its way to the gate. With whole groups, a slot idle until
        its group's next row is at the boundary too."""
        if slot.idle:
            return True
        return len(slot.batch_calls) == self._share and bool(slot.held) and len(slot.held) == len(slot.running)

    # ------------------------------------------------------------------ stragglers
    @staticmethod
    def _when(slot: _Slot) -> Callable[[_Call], tuple[int, int]]:
        """The order of the slot's calls: episode by episode, then start order."""
        order = {id(segment): k for k, segment in enumerate(slot.segments)}
        return lambda c: (order[id(c.segment)], c.index if c.turn is None else c.turn.turn_index)

    def _in_order(self, slot: _Slot) -> list[_Call]:
        """The slot's calls in the batch being collected, in order (:meth:`_when`)."""
        return sorted(slot.batch_calls, key=self._when(slot))

    @staticmethod
    def _complete(call: _Call) -> bool:
        """The call's turn is recorded and the environment has answered it: its episode has started
        a later call, or has ended (its rewards scored)."""
        return call.turn is not None and (call.segment.episode is not None or call.segment.last_started > call.index)

    def _touch(self, slot_index: int) -> None:
        """With stragglers: the slot's calls changed (the batch may now be complete)."""
        if self.max_turns_per_env is not None:
            self._dirty.add(slot_index)
            self._notify()

    def _straggler_plan(self) -> list[tuple[int, tuple[list[int], tuple[str, ...]]]] | None:
        """With stragglers: how many turns each slot gives the batch and its bootstrap prompt, once
        ``num_envs x turns_per_env`` complete turns exist (each slot's taken in order; where more
        exist, the slots that gave the most give one fewer, repeatedly); ``None`` until then, or while
        the call after a slot's last taken turn has not yet shown its prompt at the gate."""
        for i in self._dirty:
            slot, n = self._slots[i], 0
            for call in self._in_order(slot):
                if not self._complete(call):
                    break
                n += 1
            slot.complete = n
        self._dirty.clear()
        quota = self.num_envs * self.turns_per_env
        takes = [slot.complete for slot in self._slots]
        excess = sum(takes) - quota
        if excess < 0:
            return None
        while excess:
            most = max(takes)
            for i in reversed(range(len(takes))):
                if takes[i] == most and excess:
                    takes[i] -= 1
                    excess -= 1
        plan = []
        for slot, n in zip(self._slots, takes):
            bootstrap: tuple[list[int], tuple[str, ...]] | None = ([], ())
            if n:
                calls = self._in_order(slot)
                last = calls[n - 1]
                if not last.turn.done:  # type: ignore[union-attr]
                    later = [
                        c for c in (*calls[n:], *slot.running) if c.segment is last.segment and c.index > last.index
                    ]
                    following = min(later, key=lambda c: c.index, default=None)
                    bootstrap = None if following is None else following.admitted_prompt
                    if following is not None and bootstrap is None and following.prompt_ids is not None:
                        bootstrap = (list(following.prompt_ids), following.prompt_images)  # held at the gate
                    if bootstrap is None:  # on its way to the gate: its prompt comes in a moment
                        return None
            plan.append((n, bootstrap))
        return plan

    def _cut(self, plan: list[tuple[int, tuple[list[int], tuple[str, ...]]]] | None = None) -> SlotBatch:
        """Take each slot's quota of turns (with stragglers: the ``plan``'s count and bootstrap, the
        slot's later calls going to the next batch); keep only the episodes still running; admit
        nothing more until the next batch opens."""
        self._accepting = False
        for group in self._groups:  # a row still being played is not whole in any batch
            if group.playing:
                group.row.straddled = True
        turns, bootstrap, starts, seeds, compared = [], [], [], [], []
        bootstrap_images: list[tuple[str, ...]] = []
        for k, slot in enumerate(self._slots):
            calls, carried = self._in_order(slot), []
            if plan is not None:  # stragglers: the plan's turns; the slot's later calls go to the next batch
                taken, (prompt, images) = plan[k]
                calls, carried = calls[:taken], calls[taken:]
            else:
                full = len(calls) == self.turns_per_env or (self.whole_groups and len(calls) < self.turns_per_env)
                assert full, slot.index
                # an idle slot (whole groups) holds nothing: its last turn ended its play
                first_held = min(slot.held, key=self._when(slot)) if slot.held else None
                prompt = list(first_held.prompt_ids or []) if first_held is not None else []
                images = first_held.prompt_images if first_held is not None else ()
            assert all(c.turn is not None for c in calls), slot.index
            starts.append(calls[0].segment.given == 0 if calls else True)
            for call in calls:
                call.segment.given += 1
                call.segment.recorder.cut_turns.add(id(call.turn))
            turns.append([c.turn for c in calls])
            seeds.append([c.segment.seed for c in calls])
            bootstrap.append(prompt)
            bootstrap_images.append(images)
            compared.append([c.segment.row is not None and c.segment.row.whole for c in calls])
            slot.batch_calls = carried
            slot.segments = [s for s in slot.segments if s.episode is None or any(c.segment is s for c in carried)]
            self._touch(slot.index)
        batch = SlotBatch(turns, bootstrap, starts, seeds, episodes=self._ended, failed=self._failed)
        if any(bootstrap_images):
            batch.bootstrap_images = bootstrap_images
        if self.whole_groups:
            batch.compared, batch.whole_groups, batch.groups_dropped = compared, self._whole, self._dropped
            self._whole, self._dropped = [], 0
        self._ended, self._failed = [], []
        paused = [e for e in batch.failed if e.status == "interrupted"]
        if paused and not self._warned_paused:
            self._warned_paused = True
            warnings.warn(
                f"{len(paused)} episodes of this batch stopped at interrupt() and are not trained (status interrupted; "
                f"first: {(paused[0].error or '').splitlines()[0] if paused[0].error else 'no message'})",
                RuntimeWarning,
                stacklevel=2,
            )
        if batch.uncaptured_calls and not self._warned_uncaptured:
            self._warned_uncaptured = True
            warnings.warn(
                f"{batch.uncaptured_calls} model calls of this batch's episodes are not trained: they carried no "
                "verlog token data (a chat model other than the one build_graph was given) or were made outside "
                "their episode's context (loop.run_in_executor); keep such calls out of training on purpose with "
                "model.with_config(tags=[NO_TRAIN_TAG])",
                RuntimeWarning,
                stacklevel=2,
            )
        self.counters.batches += 1
        self.counters.turns += sum(len(slot) for slot in turns)
        batch.runner_state = self.state_dict()
        return batch

    # ------------------------------------------------------------------ the gate
    async def _gated_generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None, images: ImageInputs | None = None
    ) -> Generation:
        """A model call of the slots' graph: on the runner's loop, held past the slot's quota."""
        run_id, home = engine_call_run(), self._loop
        admit = self._admit(prompt_ids, sampling, request_id, run_id, images)
        if home is not None and asyncio.get_running_loop() is not home:  # not through the chat model's sync path
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(admit, home))
        return await admit

    async def _admit(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None,
        run_id: UUID | None,
        images: ImageInputs | None = None,
    ) -> Generation:
        with_images: dict[str, Any] = {} if images is None else {"images": images}
        call = self._calls.get(run_id) if run_id is not None else None
        if call is None:  # no slot trains on it
            return await self.engine.generate(prompt_ids, sampling, request_id=request_id, **with_images)
        slot = self._slots[call.segment.slot]
        call.task = asyncio.current_task()
        try:
            while not self._accepting or len(slot.batch_calls) >= self._share:
                if self._closed:  # a call the episode made while its slot was being stopped
                    raise RuntimeError("the slot runner is closed: its episodes are being stopped")
                await self._hold(slot, call, prompt_ids, images)
            call.batch, call.version = self._batch, self.policy_version
            slot.batch_calls.append(call)
            if self.max_turns_per_env is not None:  # the bootstrap of the turn before it, if a batch cuts there
                shown = () if images is None else tuple(base64.b64encode(x).decode("ascii") for x in images.images)
                call.admitted_prompt = (list(prompt_ids), shown)
                self._touch(slot.index)
            return await self.engine.generate(prompt_ids, sampling, request_id=request_id, **with_images)
        finally:
            call.task = None

    async def _hold(self, slot: _Slot, call: _Call, prompt_ids: list[int], images: ImageInputs | None) -> None:
        """Wait at the boundary until the slot may give another call; the prompt is on show meanwhile."""
        call.prompt_ids = list(prompt_ids)
        call.prompt_images = () if images is None else tuple(base64.b64encode(x).decode("ascii") for x in images.images)
        reopened = slot.reopened
        slot.held.append(call)
        self._notify()
        try:
            await reopened.wait()
        finally:
            if call in slot.held:
                slot.held.remove(call)
            call.prompt_ids, call.prompt_images = None, ()

    def _call_started(self, episode_id: str, run_id: UUID, index: int) -> None:
        """A training call of a slot's episode has started (its recorder saw it)."""
        segment = self._segments.get(episode_id)
        if segment is None:  # the episode is over (a call of a worker thread it left behind)
            return
        call = self._calls[run_id] = _Call(segment, index)
        self._slots[segment.slot].running.add(call)
        segment.last_started = max(segment.last_started, index)
        self._touch(segment.slot)

    def _call_ended(self, run_id: UUID, turn: Turn | None) -> None:
        """A training call has ended, with its turn or (an error, no token data) without one."""
        call = self._calls.pop(run_id, None)
        if call is None:
            return
        slot = self._slots[call.segment.slot]
        slot.running.discard(call)
        call.turn = turn
        if turn is not None:
            turn.policy_version = call.version
        self._touch(slot.index)
        if turn is not None and call.batch is None:
            self._stop(
                SlotFailureError(
                    f"a model call of episode {call.segment.recorder.episode_id} was answered without passing the "
                    "training gate, so it could not be trained: graphs must call the model they are given (no "
                    "LangChain cache, no model built on another engine); keep other calls out of training with "
                    "model.with_config(tags=[NO_TRAIN_TAG])"
                )
            )
        elif turn is None:  # no turn came of it: an admitted call gives its place back
            self._remove_batch_calls(slot, lambda c: c is call)
        self._notify()

    def _discard_turn(self, episode_id: str, turn: Turn) -> None:
        """A finished turn's attempt raised: it gives its place in the batch back (one already cut
        into an earlier batch stays trained)."""
        if self.keep_discarded:
            return
        segment = self._segments.get(episode_id)
        if segment is not None:
            self._remove_batch_calls(self._slots[segment.slot], lambda c: c.turn is turn)
            self._notify()

    def _late_reward(self, episode_id: str) -> None:
        """A reward (or an episode's end) was reported for a turn already cut into a batch: the
        environment answered after the boundary (another branch of the episode was held there),
        so the batch trained the turn without it."""
        self.counters.late_rewards += 1
        if self.counters.late_rewards == 1:
            warnings.warn(
                f"episode {episode_id} reported a reward for a turn already given to a batch (a branch of the graph "
                "answered after the batch boundary while another waited at it): that batch trained the turn without "
                "it; report a branch's reward before the episode's next model call",
                RuntimeWarning,
                stacklevel=2,
            )

    def _forget_calls(self, segment: _Segment) -> None:
        """An episode's graph has returned: forget its calls still running (none of a finished
        graph's are, but a timed-out episode's sync nodes may still wait in their threads) and
        cancel what they wait on; one admitted into this batch gives its place back."""
        slot = self._slots[segment.slot]
        left = [c for c in slot.running if c.segment is segment]
        for call in left:
            if call.task is not None and not call.task.done():
                call.task.cancel()
        if left:
            self._calls = {run_id: c for run_id, c in self._calls.items() if c.segment is not segment}
            slot.running.difference_update(left)
            slot.held = [c for c in slot.held if c.segment is not segment]
            self._remove_batch_calls(slot, lambda c: c in left)

    def _drop(self, segment: _Segment) -> None:
        """A failed episode's turns in this batch are dropped: the slot refills their places."""
        self._remove_batch_calls(self._slots[segment.slot], lambda c: c.segment is segment)

    def _remove_batch_calls(self, slot: _Slot, which: Callable[[_Call], bool]) -> None:
        """Take calls out of the batch being collected: their places are free for held calls."""
        kept = [c for c in slot.batch_calls if not which(c)]
        if len(kept) < len(slot.batch_calls):
            slot.batch_calls = kept
            self._touch(slot.index)
            self._reopen(slot)

    # ------------------------------------------------------------------ whole groups
    async def _join_row(self, slot: _Slot) -> _Row:
        """Wait (idle) until the slot's group starts its next row, and take its place in it."""
        group = self._groups[slot.index // self.group_size]
        slot.waiting = True
        try:
            self._schedule(group)
            while slot.next_row is None:
                slot.assigned = asyncio.Event()
                self._notify()  # an idle slot may complete the batch
                await slot.assigned.wait()
        finally:
            slot.waiting = False
        row, slot.next_row = slot.next_row, None
        return row

    def _schedule(self, group: _Group) -> None:
        """Start the group's next row if it can: all its slots wait for it, the batch admits calls
        and each slot has as many turns left to give as the longest play of the group's latest rows
        (else the row would likely straddle the boundary: the group waits for the next batch,
        whose full quota always lets it start). Rows not played whole come first."""
        if group.playing or not self._accepting or not all(s.idle for s in group.slots):
            return
        need = min(group.longest, self.turns_per_env)
        if any(self.turns_per_env - len(s.batch_calls) < need for s in group.slots):
            return  # the next batch opens it
        if group.replays:
            j, attempt = group.replays.popleft()
        else:
            j, attempt = group.next_round, 0
            group.next_round += 1
        seed = slot_seed(self.seed, j, group.index, len(self._groups))
        group.row = _Row(group.index, j, attempt, seed)
        for slot in group.slots:
            slot.episodes_started, slot.current_round = group.next_round, j
            slot.next_row = group.row
            slot.assigned.set()

    def _play_ended(self, row: _Row, segment: _Segment) -> None:
        """A play of ``row`` has ended (``segment.episode`` is set if it ended well); once all
        have, the row is whole (its episodes are compared in this batch) or dropped whole."""
        row.ended += 1
        group = self._groups[row.group]
        if segment.episode is None:
            row.spoiled = True
        else:
            row.longest = max(row.longest, len(segment.episode.turns))
            row.too_long = row.longest > self.turns_per_env
        if row.ended < self.group_size:
            return
        if row.longest:
            group.lengths.append(row.longest)
        if row.whole:
            self._whole.append([play.episode for play in row.plays])
            return
        self._dropped += 1
        self.counters.groups_dropped += 1
        if row.attempt + 1 < GROUP_ATTEMPTS and not row.too_long:
            group.replays.append((row.round, row.attempt + 1))
            return
        self.counters.groups_abandoned += 1
        if not self._warned_abandoned:
            self._warned_abandoned = True
            why = (
                f"a play made more than turns_per_env ({self.turns_per_env}) model calls, so no batch can hold "
                "its group: raise trainer.turns_per_env above the longest play"
                if row.too_long
                else f"its group could not be played whole in {GROUP_ATTEMPTS} attempts (plays straddling a batch "
                "boundary, or failing): raise trainer.turns_per_env well above the plays' length"
            )
            warnings.warn(
                f"task {row.seed} is given up for this epoch and its group never compared: {why} "
                "(groups_abandoned_total counts such rows)",
                RuntimeWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------ the slots
    def _next_seed(self, slot: _Slot) -> int:
        """The seed of the slot's next episode: its next round, or its group's newest round when
        another slot of the group has begun that one already (the group stays in step)."""
        groups = self.num_envs // self.group_size
        group, j = slot.index // self.group_size, slot.episodes_started
        if slot.replay_round is not None:  # resumed: first the episode the checkpoint left in flight
            j, slot.replay_round = slot.replay_round, None
            self._newest_round[group] = max(j, self._newest_round.get(group, -1))
        elif self.group_size > 1:
            j = max(j, self._newest_round.get(group, -1))
            self._newest_round[group] = j
        slot.episodes_started = max(slot.episodes_started, j + 1)
        slot.current_round = j
        return slot_seed(self.seed, j, group, groups)

    async def _run_slot(self, slot: _Slot) -> None:
        """Play episodes in ``slot`` forever (until cancelled)."""
        while True:
            row = await self._join_row(slot) if self.whole_groups else None
            if row is None:
                seed = self._next_seed(slot)
                episode_id = f"slot{slot.index}-ep{slot.episodes_started - 1}"
            else:  # a row played again gets a new id per attempt
                seed, episode_id = (
                    row.seed,
                    f"slot{slot.index}-ep{row.round}" + (f".{row.attempt}" if row.attempt else ""),
                )
            recorder = _SlotRecorder(
                episode_id,
                self,
                keep_messages=self.keep_messages,
                render_prompt=self.render_prompt,
                keep_discarded=self.keep_discarded,
                sampling_key=None if self.sampling_seed is None else f"train/{self.sampling_seed}/{episode_id}",
            )
            segment = _Segment(slot.index, seed, recorder, row=row)
            if row is not None:
                row.plays.append(segment)
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
                threaded = not self._inline
                run = run_episode(
                    self.graph,
                    graph_input,
                    episode_id=episode_id,
                    graph_config=self.graph_config,
                    timeout_s=self.timeout_s,
                    recorder=recorder,
                    interrupts=self.interrupts,
                )
                try:
                    episode = await (self._graph_loops[slot.index].run(run) if threaded else run)
                except BlockingCallError as exc:
                    if not segment.moved:  # the graph's code can never train: stop at once
                        self._stop(SlotFailureError(str(exc)))
                        return
                finally:
                    self._forget_calls(segment)
                if segment.moved:  # a blocking call on the runner's loop: played again on its thread
                    self.counters.moved += 1
                    self.counters.moved_calls += sum(id(t) not in recorder.cut_turns for t in recorder.turns)
                    self._segments.pop(episode_id, None)
                    slot.segments.remove(segment)
                    self._drop(segment)
                    if row is not None:  # its row is dropped and played again, like one a failure spoils
                        self._play_ended(row, segment)
                    else:
                        slot.replay_round = slot.current_round
                    self._notify()
                    continue
                if self.on_episode_end is not None and not episode.failed and episode.turns:
                    try:
                        await self.on_episode_end(episode, seed)
                    except SlotFailureError as exc:  # e.g. a judge that failed every verdict for a while
                        self._stop(exc)
                        return
                    except Exception as exc:  # e.g. a reward function failed: never a made-up reward
                        failed = recorder.episode("error", error=str(exc) or type(exc).__name__)
                        failed.seconds, episode = episode.seconds, failed
            self._segments.pop(episode_id, None)  # its calls no longer pass the gate
            if episode.failed or not episode.turns:
                slot.segments.remove(segment)  # its turns in this batch are dropped
                self._drop(segment)
                self._failed.append(episode)
                status = episode.status if episode.failed else "empty"
                self.counters.failed[status] = self.counters.failed.get(status, 0) + 1
                slot.consecutive_failures += 1
                if slot.consecutive_failures >= self.max_consecutive_failures:
                    last = (episode.error or "it made no training call").strip().splitlines()
                    self._stop(
                        SlotFailureError(
                            f"slot {slot.index} failed {slot.consecutive_failures} episodes in a row "
                            f"(max_consecutive_failures); last (seed {seed}): {episode.status}: "
                            f"{last[0] if last else 'no error message'}"
                        )
                    )
                    return
            else:
                segment.episode = episode
                self._touch(slot.index)
                slot.consecutive_failures = 0
                self._ended.append(episode)
                self.counters.episodes += 1
            if row is not None:
                self._play_ended(row, segment)
            self._notify()

    def _stop(self, error: BaseException) -> None:
        self._error = error
        self._notify()

    # ------------------------------------------------------------------ lifecycle
    def state_dict(self) -> dict[str, Any]:
        """Counters to resume from: episodes started per slot (seeds go on), the round each slot
        has in flight (played again on resume: an epoch covers every row, killed or not) and run
        totals; with whole groups, a group's row in flight counts for all its slots, and the rows
        each group has still to play again (``replays``) are kept."""
        if not self.whole_groups:
            in_flight = [slot.in_flight() for slot in self._slots]
        else:
            in_flight = [group.row.round if group.playing else None for group in self._groups for _ in group.slots]
        state = {"episodes_started": self.episodes_started, "in_flight": in_flight, "counters": self.counters.as_dict()}
        if self.whole_groups:
            state["replays"] = [[list(r) for r in group.replays] for group in self._groups]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters before the first ``collect``. Each slot first plays again the round
        it had in flight (its turns given to batches before the checkpoint stay trained; the
        episode is played whole again, so its row is not skipped), then goes on with its group.
        A state without ``in_flight`` (an older checkpoint) starts each group on a round none of
        its slots had begun. With whole groups, each group first plays again the rows it had in
        flight, then those it had still to play again, then its next round."""
        if self._tasks:
            raise RuntimeError("load_state_dict must come before the first collect()")
        started = [int(n) for n in state["episodes_started"]]
        if len(started) != self.num_envs:
            raise ValueError(f"state has {len(started)} slots, runner has {self.num_envs}")
        in_flight = state.get("in_flight")
        if in_flight is not None and len(in_flight) != self.num_envs:
            raise ValueError(f"state has {len(in_flight)} slots in flight, runner has {self.num_envs}")
        for slot in self._slots:
            first = slot.index - slot.index % self.group_size
            if in_flight is None:  # the slots of a group start in step, on a round none has begun
                slot.episodes_started = max(started[first : first + self.group_size])
                continue
            slot.episodes_started = started[slot.index]
            round_ = in_flight[slot.index]
            slot.replay_round = None if round_ is None else int(round_)
        replays = (state.get("replays") if self.whole_groups else None) or [[] for _ in self._groups]
        if len(replays) != len(self._groups):
            raise ValueError(f"state has {len(replays)} groups' replays, runner has {len(self._groups)} groups")
        for group, pending in zip(self._groups, replays):  # whole groups: first the rows in flight, then the replays
            group.next_round = max(slot.episodes_started for slot in group.slots)
            rounds = sorted({slot.replay_round for slot in group.slots if slot.replay_round is not None})
            group.replays = deque([(j, 0) for j in rounds] + [(int(j), int(a)) for j, a in pending])
            for slot in group.slots:
                slot.episodes_started, slot.replay_round = group.next_round, None
        self.counters = SlotCounters.from_dict(state["counters"])

    async def aclose(self) -> None:
        """Stop every slot (episodes in flight are cancelled, calls held at the gate too, and a
        call an episode makes meanwhile fails at once), then the slots' loops and threads."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for call in list(self._calls.values()):  # sync nodes' calls parked at the gate
            if call.task is not None and not call.task.done():
                call.task.cancel()
        for slot in self._slots:  # a call held meanwhile wakes to find the runner closed
            self._reopen(slot)
        loops, self._graph_loops = self._graph_loops, []
        await asyncio.gather(*(graph_loop.aclose() for graph_loop in loops))
        if self._node_executor is not None:
            self._node_executor.narrow(NODE_THREADS * self.num_envs)
            self._node_executor = None
