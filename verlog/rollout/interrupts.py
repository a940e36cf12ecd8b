"""Human in the loop under training: answering a graph's ``interrupt()`` pauses.

A graph that calls LangGraph's ``interrupt(value)`` stops there and returns; in production a
person answers and the graph goes on with ``Command(resume=answer)``. Under verlog an episode that
stops at an interrupt nobody answers ends with status ``interrupted`` (a failed episode: never
trained, left out of evaluation scores). With ``multi_turn.langgraph.on_interrupt:
file.py:function`` a responder plays the person: ``function(value, state)`` (sync or async) is
given the interrupt's value and the graph's state and returns the answer; the episode goes on
through LangGraph's checkpointer (the runner gives a compiled graph without one an in-memory
``InMemorySaver``, and each episode its own thread id), every policy call after the answer
trained like any other. At most ``max_resumes`` answers per episode: a graph that always
interrupts ends ``interrupted`` instead of looping forever.

The responder is the user's simulator, not the policy: its own model calls (an LLM playing the
user) are never recorded as turns.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from langchain_core.runnables import Runnable, RunnableBinding
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from verlog.config import DEFAULT_MAX_RESUMES
from verlog.rollout.recorder import recording

__all__ = [
    "DEFAULT_MAX_RESUMES",
    "INTERRUPT_OUTPUT_KEY",
    "InterruptResponder",
    "ResponderError",
    "pending_interrupts",
    "with_checkpointer",
]

#: the key of a graph's output that holds the interrupts it stopped at (LangGraph's)
INTERRUPT_OUTPUT_KEY = "__interrupt__"


def pending_interrupts(output: Any) -> list[Any]:
    """The ``Interrupt`` objects a graph run stopped at (empty: it ran to its end)."""
    if isinstance(output, dict):
        return list(output.get(INTERRUPT_OUTPUT_KEY) or [])
    return []


def describe(interrupts: list[Any], limit: int = 200) -> str:
    """The interrupts' values, short, for an episode's error line."""
    text = ", ".join(repr(getattr(i, "value", i)) for i in interrupts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_checkpointer(graph: Any) -> Any:
    """``graph`` able to resume: itself if it has a checkpointer, else a copy compiled with an
    in-memory one (a ``with_config`` binding keeps its config). ``ValueError`` for a runnable that
    is no LangGraph graph (it cannot pause or resume)."""
    if isinstance(graph, RunnableBinding):
        return graph.copy(update={"bound": with_checkpointer(graph.bound)})
    if not hasattr(graph, "checkpointer") or not hasattr(graph, "aget_state"):
        raise ValueError(
            f"multi_turn.langgraph.on_interrupt needs a compiled LangGraph graph from build_graph, got "
            f"{type(graph).__name__}"
        )
    if graph.checkpointer:  # its own (a saver, or True inside a parent graph)
        return graph
    return graph.copy(update={"checkpointer": InMemorySaver()})


#: responders loaded from configs, by (on_interrupt, max_resumes)
_LOADED: dict[tuple[str, int], "InterruptResponder"] = {}


class ResponderError(RuntimeError):
    """The ``on_interrupt`` function raised while answering a pause: the episode fails (``error``)."""


def _checkpointer_of(graph: Any) -> Any:
    """The checkpointer of a compiled graph (or of the graph a ``with_config`` binding wraps)."""
    if isinstance(graph, RunnableBinding):
        return _checkpointer_of(graph.bound)
    return getattr(graph, "checkpointer", None) or None


@dataclass
class InterruptResponder:
    """Answers an episode's interrupts: ``respond(value, state) -> answer`` per interrupt, at most
    ``max_resumes`` times per episode."""

    respond: Callable[[Any, Any], Any]
    max_resumes: int = DEFAULT_MAX_RESUMES
    _graphs: dict[int, tuple[Any, Any]] = field(default_factory=dict, repr=False)
    #: the in-memory savers it gave graphs (their episodes' threads are deleted as episodes end)
    _savers: dict[int, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, langgraph: Any) -> "InterruptResponder | None":
        """The responder ``multi_turn.langgraph`` configures (``None`` without ``on_interrupt``),
        loaded once per function and bound; ``ConfigError`` naming the key when the function
        cannot be loaded."""
        if not langgraph.on_interrupt:
            return None
        key = (langgraph.on_interrupt, langgraph.max_resumes)
        if key not in _LOADED:
            from verlog.rewards.functions import load_function  # lazy: rewards import the rollout records

            function = load_function(
                langgraph.on_interrupt, where="multi_turn.langgraph.on_interrupt", what="responder file"
            )
            _LOADED[key] = cls(function, langgraph.max_resumes)
        return _LOADED[key]

    def graph_for(self, graph: Any) -> Any:
        """``graph`` with a checkpointer (made once per graph)."""
        known = self._graphs.get(id(graph))
        if known is None or known[0] is not graph:
            resumable = with_checkpointer(graph)
            saver = _checkpointer_of(resumable)
            if saver is not None and saver is not _checkpointer_of(graph):
                self._savers[id(saver)] = saver
            known = self._graphs[id(graph)] = (graph, resumable)
        return known[1]

    async def forget(self, graph: Any, config: Any) -> None:
        """An episode of ``graph`` (as :meth:`graph_for` made it) has ended: delete its thread from
        the in-memory saver verlog gave the graph (a graph's own checkpointer is left alone), so a
        long training run keeps no finished episode's checkpoints."""
        saver = _checkpointer_of(graph)
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        if saver is not None and id(saver) in self._savers and thread is not None:
            await saver.adelete_thread(thread)

    async def answer(self, graph: Runnable, config: Any, interrupts: list[Any]) -> Command:
        """The ``Command`` resuming ``graph`` (run with ``config``) past ``interrupts``: one
        answer per interrupt, keyed by interrupt id when several are pending at once."""
        state = await graph.aget_state(config)
        values = getattr(state, "values", state)
        answers = []
        with recording(None):  # the responder's own model calls are no turns
            for interrupt in interrupts:
                try:
                    answer = self.respond(getattr(interrupt, "value", interrupt), values)
                    if inspect.isawaitable(answer):
                        answer = await answer
                except Exception as exc:  # the episode fails (status error), saying whose fault it is
                    name = getattr(self.respond, "__name__", "the responder")
                    raise ResponderError(
                        f"multi_turn.langgraph.on_interrupt: {name} raised {type(exc).__name__}: {exc}"
                    ) from exc
                answers.append(answer)
        if len(interrupts) == 1:
            return Command(resume=answers[0])
        return Command(resume={i.id: a for i, a in zip(interrupts, answers)})
