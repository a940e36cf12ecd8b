"""``TurnRecorder``: the LangChain callback that turns a graph run's model calls into ``Turn``s.

Give one recorder to each episode's run config (``config={"callbacks": [recorder]}``). LangChain
hands it every chat-model call in the run, sub-graphs and parallel branches included, and every
``verlog.reward`` custom event the environment node dispatches. Nothing inside the graph knows
it is being recorded. While :func:`recording` is in effect (``run_episode`` uses it) the recorder
also joins every callback manager LangChain configures in that context, so a call made with its
own ``config={"callbacks": [...]}`` (which replaces the run's callbacks) is still recorded.

* Turn order is the order in which calls *started*: a turn's ``turn_index`` is its call's place
  among the episode's training calls, given when the call starts and never changed, so no two
  turns of an episode share one, whichever batches they are trained in (a discarded or failed
  call leaves its number unused).
* A call becomes a turn when its ``AIMessage`` carries verlog's token data (``prompt_ids``,
  ``response_ids``, ``logprobs``); calls of other chat models are counted as uncaptured.
* A call tagged :data:`NO_TRAIN_TAG` (``model.with_config(tags=[NO_TRAIN_TAG])``, e.g. a judge
  or a summarizer reusing the policy model) is never a turn and never counted as uncaptured.
* A reward goes to one finished turn, chosen the same way on every run (never by which thread
  finished first): the latest turn of the LangGraph node (task) that reports it, if that node made
  a training call; else (an environment node after the policy node, a join after parallel
  branches) the latest turn in LangGraph's own order: by superstep, then by the task's path
  (``langgraph_path``, which orders parallel branches and ``Send`` tasks), then by start order,
  level by level through sub-graphs. A judge's own call between them changes nothing. (Calls
  that one node makes at once, ``model.batch`` or ``asyncio.gather``, are ordered by when LangChain
  started them. Under the slot runner a turn already trained in an earlier batch is passed over
  when another candidate is not, so a reward is never lost to a batch boundary.)
* A call made inside an attempt that then raised (a node retried by a ``RetryPolicy``, a chain
  retried by ``with_retry`` or replaced by ``with_fallbacks``, a sub-chain whose error the node
  caught) is *discarded*: its output was thrown away, so it is no action. It leaves the turns
  (``discarded``, counted as ``discarded_calls``) unless ``keep_discarded``. A call that itself
  errored never becomes a turn. LangGraph's control flow (``interrupt()``, ``Command(graph=PARENT)``)
  is no failure, except that a node stopped by ``interrupt()`` runs again from its start on resume:
  the calls it made before ``interrupt()`` are discarded too.
* Each turn keeps the sampling its call was made with (``temperature``, ``top_p``, ``top_k``,
  as the chat model reports them), so a node bound to its own temperature is trained at it.
* With a ``sampling_key`` (evaluation and training give one) the recorder names each call's
  sampling seed as it starts (:mod:`verlog.llm.call_seeds`): the key, the call's LangGraph place
  (superstep and task path, level by level) and how many calls that place made before it. The same
  episode then draws the same tokens however many others run beside it.
* A reward event that truncates the episode may carry ``next_messages``, the prompt the model
  would be given next: with a ``render_prompt`` the recorder renders it, with the tools of the
  turn's own call, into the turn's ``next_prompt_ids`` (the state the critic bootstraps from).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from langchain_core.tracers.context import register_configure_hook
from langgraph.errors import GraphBubbleUp, GraphInterrupt

from verlog.llm.call_seeds import assign_call_seed, derive_seed, release_call_seed
from verlog.llm.images import is_image_block
from verlog.llm.metadata import SamplingMetadata, TokenMetadata, has_tokens
from verlog.rollout.events import REWARD_EVENT, DirectListener, RewardPayload
from verlog.rollout.turn import Episode, EpisodeStatus, Turn

__all__ = ["NO_TRAIN_TAG", "RenderPrompt", "TurnRecorder", "active_recorder", "recording"]

#: the LangChain tag that keeps a model call out of training: ``model.with_config(tags=[NO_TRAIN_TAG])``
NO_TRAIN_TAG = "verlog:no_train"

#: ``render_prompt(messages, tools) -> prompt ids``: how the chat model renders a call (e.g. the
#: ``render`` method of a :class:`verlog.llm.prompt.PromptRenderer`)
RenderPrompt = Callable[[Sequence[BaseMessage], "list[dict] | None"], list[int]]

#: the recorder of the episode running in this context (see :func:`recording`)
_ACTIVE: ContextVar["TurnRecorder | None"] = ContextVar("verlog_active_recorder", default=None)
register_configure_hook(_ACTIVE, inheritable=True)


#: where a call stands in LangGraph's order: per node level, root first, (superstep, task path);
#: then its start order (see :meth:`TurnRecorder._recipient`)
OrderKey = tuple[tuple[tuple[int, Any], ...], int]


def _holds_images(messages: Sequence[BaseMessage]) -> bool:
    """Whether any of ``messages`` has an image content block."""
    return any(not isinstance(m.content, str) and any(is_image_block(b) for b in m.content) for m in messages)


def _orderable(part: Any) -> Any:
    """A LangGraph task path (``('__pregel_push', 2, ...)``, nested for tasks started by tasks) as
    something Python orders the same way on every run: numbers as numbers (branch 10 after 2),
    names as text, nested paths element by element."""
    if isinstance(part, (tuple, list)):
        return (2, tuple(_orderable(x) for x in part))
    if isinstance(part, (int, float)) and not isinstance(part, bool):
        return (0, part)
    return (1, str(part))


@dataclass(frozen=True)
class _Lineage:
    """Where a call was made: the chain runs above it and the LangGraph node run nearest to it."""

    ancestors: frozenset[UUID]
    node_run: UUID | None
    key: OrderKey


@dataclass
class _Chain:
    """A chain run under way: its parent and, for a LangGraph node run, its place in the order."""

    parent: UUID | None
    #: a LangGraph node (task) run: (superstep, orderable task path); ``None`` for any other chain
    place: tuple[int, Any] | None


@contextlib.contextmanager
def recording(recorder: "TurnRecorder | None") -> Iterator[None]:
    """Make ``recorder`` a handler of every LangChain run started in this context (tasks created
    inside it keep it): calls made with callbacks of their own are recorded too. ``None``: no
    recorder joins (e.g. an interrupt responder's own model calls)."""
    token = _ACTIVE.set(recorder)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_recorder() -> "TurnRecorder | None":
    """The recorder of the episode running in this context (``None`` outside :func:`recording`)."""
    return _ACTIVE.get()


class TurnRecorder(BaseCallbackHandler, DirectListener):
    """Records the turns of one episode.

    Args:
        episode_id: stamped on every turn.
        keep_messages: also keep each call's input messages on its turn (for tests, debugging
            and ``verlog rollout --show-messages``; costs memory on long episodes).
        render_prompt: renders a truncated turn's ``next_messages`` to ``next_prompt_ids``
            (``VerlogChatModel.render_prompt_ids``); without it they are ignored.
        keep_discarded: keep the turns of calls made in attempts that then raised (they are
            still counted in ``discarded_calls``); by default they are left out.
        sampling_key: the key of the episode's sampling seeds (e.g. its task and seed): each call
            without a seed of its own samples with one derived from it and the call's place
            (see the module doc). ``None``: calls sample from their engine's own randomness.
            Never give two plays that must differ (a group of one task) the same key.
    """

    run_inline = True  # called in the event loop's thread, no executor hop
    raise_error = True  # a malformed reward event is a bug in the graph: surface it
    ignore_chain = False  # chain runs tell which attempt a call belongs to, and where it stands
    ignore_agent = True
    ignore_retriever = True
    ignore_retry = True

    def __init__(
        self,
        episode_id: str,
        *,
        keep_messages: bool = False,
        render_prompt: RenderPrompt | None = None,
        keep_discarded: bool = False,
        sampling_key: str | None = None,
    ):
        self.episode_id = episode_id
        self.sampling_key = sampling_key
        self.keep_messages = keep_messages
        self.render_prompt = render_prompt
        self.keep_discarded = keep_discarded
        self.turns: list[Turn] = []
        #: turns of calls made in attempts that then raised (left out of ``turns`` unless ``keep_discarded``)
        self.discarded: list[Turn] = []
        #: chat-model calls started, trained or not
        self.model_calls = 0
        #: calls not trained though not kept out: another chat model's (no token data), or made
        #: outside the episode's context (``verlog.rollout.outside_calls``)
        self.uncaptured_calls = 0
        self._seen: set[UUID] = set()  # every chat-model call this recorder saw start
        self.unassigned_reward = 0.0
        self._started = 0
        #: training calls under way: (start order, node, kept messages, offered tools, lineage)
        self._pending: dict[UUID, tuple[int, str | None, list[BaseMessage] | None, list[dict] | None, _Lineage]] = {}
        #: chain runs under way, and those that ended in an error (their calls are discarded)
        self._chains: dict[UUID, _Chain] = {}
        self._failed_runs: set[UUID] = set()
        self._discarded_ids: set[int] = set()
        self._lineage: dict[int, _Lineage] = {}  # id(turn) -> where its call was made
        #: the turns by LangGraph's order (key, then finish order), and by the node run that made
        #: them: a reward finds its turn without scanning the episode (which may be hundreds of turns)
        self._ordered: list[tuple[OrderKey, int, Turn]] = []
        self._by_node: dict[UUID, list[Turn]] = {}
        self._tools: dict[int, list[dict] | None] = {}  # id(turn) -> tools of its call
        #: calls started at each LangGraph place, and the calls given a seed that have not ended
        self._calls_at: dict[tuple[tuple[int, Any], ...], int] = {}
        self._seeded: set[UUID] = set()
        self._lock = threading.Lock()  # sync nodes may call models from executor threads

    # ------------------------------------------------------------------ callbacks
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, messages, tags, metadata, kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, response)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._pending.pop(run_id, None)
            self._call_over(run_id)

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._reward(name, data, run_id)

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        place = None
        if metadata and "langgraph_step" in metadata and kwargs.get("name") == metadata.get("langgraph_node"):
            place = (int(metadata["langgraph_step"]), _orderable(metadata.get("langgraph_path", ())))
        self._chains[run_id] = _Chain(parent_run_id, place)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._chains.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        chain = self._chains.pop(run_id, None)
        if chain is None or chain.parent is None:  # the graph run itself failed: the episode does
            return
        if isinstance(error, GraphBubbleUp):  # control flow, not a failure...
            if isinstance(error, GraphInterrupt) and chain.place is not None:
                self._discard(lambda lineage: lineage.node_run == run_id)  # ...but the node runs again on resume
            return
        with self._lock:
            self._failed_runs.add(run_id)
        self._discard(lambda lineage: run_id in lineage.ancestors)

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._chains[run_id] = _Chain(parent_run_id, None)  # a model call inside a tool still finds its node

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._chains.pop(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.on_chain_error(error, run_id=run_id)  # a tool that raised threw its calls' answers away too

    # ------------------------------------------------------------------ attempts that raised
    def _lineage_of(self, parent: UUID | None) -> _Lineage:
        """The chain runs above a call or event whose parent run is ``parent``, and its place."""
        ancestors: list[UUID] = []
        places: list[tuple[int, Any]] = []
        node_run = None
        while parent is not None and parent not in ancestors:
            ancestors.append(parent)
            chain = self._chains.get(parent)
            if chain is None:
                break
            if chain.place is not None:
                places.append(chain.place)
                node_run = node_run or parent
            parent = chain.parent
        return _Lineage(frozenset(ancestors), node_run, (tuple(reversed(places)), 0))

    def _discard(self, which: Callable[[_Lineage], bool]) -> list[Turn]:
        """Mark the finished turns whose call ``which`` selects as discarded; returns them."""
        with self._lock:
            hit = [t for t in self.turns if id(t) not in self._discarded_ids and which(self._lineage[id(t)])]
            self.discarded.extend(hit)
            self._discarded_ids.update(id(t) for t in hit)
            if hit and not self.keep_discarded:
                gone = {id(t) for t in hit}
                self.turns = [t for t in self.turns if id(t) not in gone]
                self._ordered = [entry for entry in self._ordered if id(entry[2]) not in gone]
                self._by_node = {
                    run: kept
                    for run, turns in self._by_node.items()
                    if (kept := [t for t in turns if id(t) not in gone])
                }
        for turn in hit:
            self._on_discarded(turn)
        return hit

    def _on_discarded(self, turn: Turn) -> None:
        """Hook: a finished turn was discarded (the slot runner gives its batch place back)."""

    # ------------------------------------------------------------------ the steps of a call
    def _reward(self, name: str, data: RewardPayload | Any, run_id: UUID | None = None) -> Turn | None:
        """Add a reward event to its turn (see the module's rule); returns that turn (``None`` for
        another event, or a reward before the first turn)."""
        if name != REWARD_EVENT:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("reward"), (int, float)):
            raise ValueError(f"{REWARD_EVENT} event needs a dict with a numeric 'reward', got {data!r}")
        with self._lock:
            turn = self._recipient(run_id)
            if turn is None:
                self.unassigned_reward += float(data["reward"])
                return None
            turn.reward += float(data["reward"])
            turn.terminated = turn.terminated or bool(data.get("terminated", False))
            turn.truncated = turn.truncated or bool(data.get("truncated", False))
            if data.get("info"):
                turn.info.update(data["info"])
            next_messages = data.get("next_messages")
            if turn.truncated and next_messages and self.render_prompt is not None and not _holds_images(next_messages):
                # (a next state with pictures is not rendered without them: its value is unknown)
                turn.next_prompt_ids = list(self.render_prompt(next_messages, self._tools.get(id(turn))))
            return turn

    def _recipient(self, run_id: UUID | None) -> Turn | None:
        """The turn a reward reported from run ``run_id`` goes to (under the lock): the latest of
        the reporting node's own turns, else the latest turn in LangGraph's order; among those, the
        latest :meth:`_preferred` one if any is."""
        node_run = self._lineage_of(run_id).node_run if run_id is not None else None
        own = [t for t in self._by_node.get(node_run, ()) if self._candidate(t)] if node_run is not None else []
        if own:
            latest_first: Iterable[Turn] = sorted(own, key=lambda t: self._lineage[id(t)].key, reverse=True)
        else:
            latest_first = (t for _, _, t in reversed(self._ordered) if self._candidate(t))
        first = None
        for turn in latest_first:
            if self._preferred(turn):
                return turn
            if first is None:
                first = turn
        return first

    def _candidate(self, turn: Turn) -> bool:
        """Whether a reward may go to ``turn`` at all (not a discarded attempt's, kept for training)."""
        return not self.keep_discarded or id(turn) not in self._discarded_ids

    def _preferred(self, turn: Turn) -> bool:
        """Hook: whether a reward should go to ``turn`` rather than to an earlier candidate (the
        slot runner passes over turns already trained in an earlier batch when another is not)."""
        return True

    # ------------------------------------------------------------------ the steps of a call
    def _start(
        self,
        run_id: UUID,
        messages: list[list[BaseMessage]],
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> int | None:
        """Note a call's start; returns its turn index, ``None`` for a call kept out of training."""
        with self._lock:
            self.model_calls += 1
            self._seen.add(run_id)
            self._seed_call(run_id, kwargs.get("parent_run_id"))
            if tags and NO_TRAIN_TAG in tags:
                return None
            node = (metadata or {}).get("langgraph_node")
            kept = list(messages[0]) if self.keep_messages and messages else None
            tools = (kwargs.get("invocation_params") or {}).get("tools")
            index = self._started
            lineage = self._lineage_of(kwargs.get("parent_run_id"))
            lineage = _Lineage(lineage.ancestors, lineage.node_run, (lineage.key[0], index))
            self._pending[run_id] = (index, node, kept, tools, lineage)
            self._started += 1
            return index

    def _finish(self, run_id: UUID, response: LLMResult) -> tuple[bool, Turn | None]:
        """Turn a finished training call into a turn: returns (whether the call was a training
        call, its turn); a call whose answer carries no verlog token data leaves no turn."""
        with self._lock:
            self._call_over(run_id)
            started = self._pending.pop(run_id, None)
            if started is None:  # kept out of training, or a plain (non-chat) LLM
                return False, None
            index, node, messages, tools, lineage = started
            generation = response.generations[0][0] if response.generations and response.generations[0] else None
            message = getattr(generation, "message", None)
            meta: TokenMetadata = getattr(message, "response_metadata", None) or {}
            if not has_tokens(meta):
                self.uncaptured_calls += 1
                return True, None
            sampling: SamplingMetadata = meta.get("sampling") or {}
            turn = Turn(
                episode_id=self.episode_id,
                turn_index=index,
                prompt_ids=meta["prompt_ids"],
                response_ids=meta["response_ids"],
                logprobs=meta["logprobs"],
                finish_reason=meta.get("finish_reason", ""),
                temperature=float(sampling.get("temperature", 1.0)),
                top_p=float(sampling.get("top_p", 1.0)),
                top_k=int(sampling.get("top_k", -1)),
                constraint=sampling.get("constraint"),
                grammar=sampling.get("grammar"),
                images=tuple(meta.get("images") or ()),
                node=node,
                messages=messages,
            )
            self._lineage[id(turn)] = lineage
            if lineage.ancestors & self._failed_runs:  # its attempt raised while it was under way
                self.discarded.append(turn)
                self._discarded_ids.add(id(turn))
                if not self.keep_discarded:
                    return True, None
            self.turns.append(turn)
            bisect.insort(self._ordered, (lineage.key, len(self._lineage), turn))
            if lineage.node_run is not None:
                self._by_node.setdefault(lineage.node_run, []).append(turn)
            if self.render_prompt is not None:
                self._tools = {id(turn): tools}  # only the latest call's tools can be needed
            return True, turn

    def count_outside_call(self, run_id: UUID) -> bool:
        """A chat-model call of this episode was made outside its context (a function a node handed
        to ``loop.run_in_executor``): count it as uncaptured unless this recorder saw it itself (the
        function passed the node's config). Returns whether it was counted."""
        with self._lock:
            if run_id in self._seen:
                return False
            self.model_calls += 1
            self.uncaptured_calls += 1
            return True

    def _seed_call(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        """Name the sampling seed of a call starting under ``parent_run_id`` (under the lock)."""
        if self.sampling_key is None:
            return
        place = self._lineage_of(parent_run_id).key[0]
        made = self._calls_at.get(place, 0)
        self._calls_at[place] = made + 1
        assign_call_seed(run_id, derive_seed(self.sampling_key, place, made))
        self._seeded.add(run_id)

    def _call_over(self, run_id: UUID) -> None:
        """A call ended: its seed is of no more use (under the lock)."""
        if run_id in self._seeded:
            self._seeded.discard(run_id)
            release_call_seed(run_id)

    # ------------------------------------------------------------------ result
    def episode(self, status: EpisodeStatus = "ok", *, error: str | None = None, output: Any = None) -> Episode:
        """The episode recorded so far, ended with ``status``.

        A graph that reached its end without the environment saying so ends its last turn as
        ``terminated``: the run is over, nothing follows to bootstrap from.
        """
        with self._lock:  # (never renumbered: a turn may be trained already, under its number)
            turns = sorted(self.turns, key=lambda t: t.turn_index)
            for run_id in list(self._seeded):  # calls that never reported their end
                self._call_over(run_id)
        if status == "ok" and turns and not turns[-1].done:
            turns[-1].terminated = True
        return Episode(
            episode_id=self.episode_id,
            turns=turns,
            status=status,
            error=error,
            output=output,
            unassigned_reward=self.unassigned_reward,
            uncaptured_calls=self.uncaptured_calls,
            model_calls=self.model_calls,
            discarded_calls=len(self.discarded),
        )
