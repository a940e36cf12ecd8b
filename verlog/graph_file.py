"""Loading an agent from a ``graphs/*.py`` file.

A graph file is an ordinary Python module that exposes:

``build_graph(model, **graph_kwargs)`` (required)
    Returns a compiled LangGraph graph (anything with ``ainvoke``). ``model`` is a LangChain
    chat model: verlog's own under training and evaluation, any other (e.g. ``ChatOpenAI``) in
    production. ``graph_kwargs`` come from ``multi_turn.langgraph.graph_kwargs``.

``make_input(seed)`` (needed to start episodes: ``verlog rollout``, training, evaluation)
    Returns the graph's input for the episode with this seed (e.g. the task to solve).

The file must not import training code: rewards are reported with LangChain custom events
(``verlog.rollout.report_reward`` is a thin wrapper over them). A file inside a ``graphs/``
folder may import its project's ``tools/`` package: the project folder is put on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from langchain_core.language_models import BaseChatModel


class GraphFileError(ValueError):
    """A graph file is missing, fails to import, or lacks what verlog needs."""


@dataclass
class GraphFile:
    """A loaded graph file: its module, factory and (optional) episode-input maker."""

    path: Path
    module: ModuleType
    build_graph: Callable[..., Any]
    make_input: Callable[[int], Any] | None

    def build(self, model: BaseChatModel, **graph_kwargs: Any) -> Any:
        """Call the file's ``build_graph`` and check it returned something runnable."""
        try:
            graph = self.build_graph(model, **graph_kwargs)
        except TypeError as exc:
            params = ", ".join(inspect.signature(self.build_graph).parameters)
            raise GraphFileError(
                f"{self.path}: build_graph({params}) rejected graph_kwargs {sorted(graph_kwargs)}: {exc}"
            ) from exc
        if not hasattr(graph, "ainvoke"):
            raise GraphFileError(
                f"{self.path}: build_graph returned {type(graph).__name__}, not a runnable graph "
                "(did you forget .compile()?)"
            )
        return graph

    def episode_input(self, seed: int) -> Any:
        """The graph input for the episode with ``seed``."""
        if self.make_input is None:
            raise GraphFileError(
                f"{self.path} defines no make_input(seed); verlog needs it to start episodes "
                "(return the graph's input state for that seed)"
            )
        return self.make_input(seed)


def load_graph_file(path: str | Path) -> GraphFile:
    """Import a graph file by path and check it exposes ``build_graph``."""
    path = Path(path).resolve()
    if not path.is_file():
        raise GraphFileError(f"graph file {str(path)!r} does not exist")
    if path.suffix != ".py":
        raise GraphFileError(f"graph file {str(path)!r} is not a .py file")
    project = path.parent.parent
    if path.parent.name == "graphs" and str(project) not in sys.path:
        sys.path.insert(0, str(project))  # so the file can `import tools.x`
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"verlog_graph_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise GraphFileError(f"graph file {path} failed to import: {type(exc).__name__}: {exc}") from exc
    build = getattr(module, "build_graph", None)
    if not callable(build):
        raise GraphFileError(
            f"graph file {path} has no build_graph(model, **kwargs) function; a graph file must define "
            "build_graph, taking a LangChain chat model and returning a compiled LangGraph graph"
        )
    make_input = getattr(module, "make_input", None)
    if make_input is not None and not callable(make_input):
        raise GraphFileError(f"graph file {path}: make_input must be a function make_input(seed)")
    return GraphFile(path=path, module=module, build_graph=build, make_input=make_input)
