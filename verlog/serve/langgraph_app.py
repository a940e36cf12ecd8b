"""The graph files of ``graphs/*.py``, built around LangChain's ``ChatOpenAI``, for LangGraph's server.

A ``langgraph.json`` names graphs of this module; LangGraph's own tooling (``langgraph dev``,
``langgraph up``, LangGraph Platform) then serves them with its HTTP API (threads, runs,
streaming, a checkpointer per thread)::

    {"graphs": {"guess_number": "verlog.serve.langgraph_app:guess_number",
                "graph": "verlog.serve.langgraph_app:graph"}}

What this module exposes, all built when it is imported (errors show at server start):

* ``graph``: the file named by ``$VERLOG_GRAPH``, built with the JSON keyword arguments in
  ``$VERLOG_GRAPH_KWARGS`` (what ``verlog serve GRAPH`` runs);
* one graph per file of ``$VERLOG_GRAPHS_DIR`` (default: ``./graphs``), named after the file
  (``calculator``, ``guess_number``, ``babyai``, ...), built with its defaults.

The graph files are used unchanged: ``build_graph(model)`` receives a ``ChatOpenAI`` pointed at
any OpenAI-compatible endpoint (verlog's ``serve-model``, vLLM, SGLang, OpenAI), configured by:

``VERLOG_BASE_URL`` (required)  the endpoint, e.g. ``http://127.0.0.1:8000/v1``
``VERLOG_MODEL`` (required)     the model name the endpoint serves
``VERLOG_API_KEY``              its API key (default: ``EMPTY``)
``VERLOG_TEMPERATURE``, ``VERLOG_MAX_TOKENS``, ``VERLOG_SEED``, ``VERLOG_TIMEOUT_S``,
``VERLOG_MAX_RETRIES``          defaults of every call (nodes still override with ``.bind``)
``VERLOG_RECURSION_LIMIT``      every run's recursion limit (default: each graph's own, else 100)

**Recursion limits.** Each served graph runs with its own limit (verlog's game graphs carry the
limit of their longest episode, e.g. 394 for BabyAI's 128 steps) unless a run's config sets one,
in every stream mode: with ``stream_mode`` including ``"events"`` LangGraph's server runs
``astream_events``, whose config defaults fill in LangChain's 25 before the graph sees its own
limit; :func:`with_own_recursion_limit` keeps the graph's instead.

**Episodes.** Every model call of a run names the run's thread as its episode (the OpenAI
``user`` field, unless a node binds its own; :func:`verlog.traces.episode_chat_openai`): a ``serve-model --record`` endpoint files a
thread's turns as one episode, to which feedback can then be posted by thread id
(docs/production_loop.md).

Rewards reported by environment nodes (``areport_reward``) are LangChain custom events: with no
training recorder listening they change nothing, and a client streaming with
``stream_mode="events"`` sees them as ``on_custom_event`` named ``verlog.reward``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from verlog.config import json_object
from verlog.graph_file import load_graph_file
from verlog.serve.durable import continued_input

log = logging.getLogger(__name__)

__all__ = ["chat_model_from_env", "build_served_graph", "graph_kwargs_from_env", "with_own_recursion_limit"]


def chat_model_from_env(environ: dict[str, str] | None = None) -> Any:
    """A ``ChatOpenAI`` configured from ``VERLOG_*`` environment variables (see the module doc)."""
    from verlog.traces.episode_model import episode_chat_openai

    env = os.environ if environ is None else environ
    missing = [name for name in ("VERLOG_BASE_URL", "VERLOG_MODEL") if not env.get(name)]
    if missing:
        raise RuntimeError(
            f"set {' and '.join('$' + m for m in missing)}: the OpenAI-compatible endpoint the served graphs "
            "call (e.g. VERLOG_BASE_URL=http://127.0.0.1:8000/v1 VERLOG_MODEL=tiny, from `verlog serve-model tiny`)"
        )
    kwargs: dict[str, Any] = {
        "base_url": env["VERLOG_BASE_URL"],
        "model": env["VERLOG_MODEL"],
        "api_key": env.get("VERLOG_API_KEY") or "EMPTY",
    }
    for key, name, kind in (
        ("temperature", "VERLOG_TEMPERATURE", float),
        ("max_tokens", "VERLOG_MAX_TOKENS", int),
        ("timeout", "VERLOG_TIMEOUT_S", float),
        ("max_retries", "VERLOG_MAX_RETRIES", int),
        ("seed", "VERLOG_SEED", int),
    ):
        raw = env.get(name)
        if raw not in (None, ""):
            try:
                kwargs[key] = kind(raw)
            except ValueError:
                raise ValueError(f"${name}={raw!r} is not a valid {kind.__name__}") from None
    return episode_chat_openai(**kwargs)


def graph_kwargs_from_env() -> dict[str, Any]:
    """``$VERLOG_GRAPH_KWARGS``: a JSON object of ``build_graph`` keyword arguments."""
    return json_object(os.environ.get("VERLOG_GRAPH_KWARGS") or "{}", "$VERLOG_GRAPH_KWARGS")


def recursion_limit_from_env() -> int | None:
    """``$VERLOG_RECURSION_LIMIT`` (``verlog serve --recursion-limit``), or ``None``."""
    raw = os.environ.get("VERLOG_RECURSION_LIMIT") or ""
    if not raw:
        return None
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ValueError(f"$VERLOG_RECURSION_LIMIT={raw!r} must be an integer >= 1")
    return limit


def with_own_recursion_limit(graph: Any, limit: int | None = None) -> Any:
    """``graph`` running with ``limit`` (default: its own, else 100) whenever a run's config sets
    none, also under ``astream_events`` (which LangGraph's server uses for ``stream_mode``
    ``"events"``, and which otherwise gives the graph LangChain's default of 25); and a run the
    server retries after a crash going on from its last checkpoint instead of starting again
    (:func:`verlog.serve.durable.continued_input`)."""
    from langgraph.pregel import Pregel

    from verlog.rollout.runner import recursion_limit_of

    if not isinstance(graph, Pregel):  # not a compiled LangGraph graph: LangGraph's server runs it as it is
        return graph
    limit = limit if limit is not None else recursion_limit_of(graph)
    graph = graph.with_config(recursion_limit=limit)
    base = type(graph)

    async def astream_events(self: Any, input: Any, config: Any = None, **kwargs: Any):
        config = dict(config or {})
        if config.get("recursion_limit") is None:
            config["recursion_limit"] = self.config["recursion_limit"]
        async for event in base.astream_events(self, input, config, **kwargs):
            yield event

    async def astream(self: Any, input: Any, config: Any = None, **kwargs: Any):
        # a run the server retries after a crash goes on from its last checkpoint (verlog.serve.durable)
        input = await continued_input(self, input, config)
        async for chunk in base.astream(self, input, config, **kwargs):
            yield chunk

    served = type(
        base.__name__, (base,), {"astream_events": astream_events, "astream": astream, "__module__": base.__module__}
    )
    return served(**{k: v for k, v in graph.__dict__.items() if k != "__orig_class__"})


def build_served_graph(path: str | Path, model: Any, **graph_kwargs: Any) -> Any:
    """Build the graph file at ``path`` around ``model`` (the file is used unchanged), with its
    recursion limit kept in every stream mode (:func:`with_own_recursion_limit`)."""
    graph = load_graph_file(path).build(model, **graph_kwargs)
    return with_own_recursion_limit(graph, recursion_limit_from_env())


def _build_all() -> dict[str, Any]:
    model = chat_model_from_env()
    graphs: dict[str, Any] = {}
    single = os.environ.get("VERLOG_GRAPH")
    if single:
        graphs["graph"] = build_served_graph(single, model, **graph_kwargs_from_env())
    folder = os.environ.get("VERLOG_GRAPHS_DIR", "graphs")  # set it empty to serve only `graph`
    if folder and Path(folder).is_dir():
        for path in sorted(Path(folder).glob("*.py")):
            if path.stem.startswith("_"):
                continue
            if path.stem in globals() or path.stem in graphs:
                log.warning("verlog: graph file %s is not served: its name is taken in %s", path, __name__)
                continue
            try:
                graphs[path.stem] = build_served_graph(path, model)
            except Exception as exc:  # one broken file must not hide the others
                log.error("verlog: graph %s is not served: %s", path, exc)
    return graphs


globals().update(_build_all())
