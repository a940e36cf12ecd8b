"""Production reuse: serve a trained checkpoint and the same graph files, unchanged.

* :mod:`verlog.serve.openai_server`: an OpenAI-compatible chat server on any verlog engine
  (``verlog serve-model CHECKPOINT``), its endpoints routed through one module per job: the wire
  format (:mod:`verlog.serve.openai_protocol`), request limits (:mod:`verlog.serve.limits`),
  error JSON, header bounds, keys and bodies (:mod:`verlog.serve.http_guards`), admission: lanes,
  places, prompt bounds (:mod:`verlog.serve.admission`), a request made into an engine call and
  back, streamed or whole (:mod:`verlog.serve.completion`), recording and feedback
  (:mod:`verlog.serve.trace_capture`), model versions swapped in without dropping requests
  (:mod:`verlog.serve.policy_swap`).
* :mod:`verlog.serve.langgraph_app`: the graphs of ``graphs/*.py`` built around LangChain's
  ``ChatOpenAI`` for LangGraph's own server (``langgraph.json``, ``verlog serve GRAPH``), their
  threads kept by a durable checkpointer (:mod:`verlog.serve.durable`: SQLite or Postgres).
* :mod:`verlog.serve.commands`: the ``serve-model`` and ``serve`` commands.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["OpenAIServer", "ServerLimits", "run_server", "serve_in_thread"]


def __getattr__(name: str) -> Any:
    """The server's names, imported on first use: ``verlog.serve.commands`` (the CLI's parsers)
    loads without the engine and torch, so ``verlog --help`` stays fast."""
    if name not in __all__:
        raise AttributeError(f"module 'verlog.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module("verlog.serve.openai_server"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # what type checkers and IDEs see
    from verlog.serve.openai_server import OpenAIServer, ServerLimits, run_server, serve_in_thread
