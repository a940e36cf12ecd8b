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
A file anywhere else may import its neighbours (``import helpers`` for ``helpers.py`` beside it),
as ``python file.py`` lets it: its folder is on ``sys.path`` while it is imported.
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
        """Call the file's ``build_graph`` and check it returned something runnable.

        Whatever goes wrong (kwargs the signature does not take, an exception inside
        ``build_graph``, a result that is not a compiled graph) is a ``GraphFileError`` naming
        the file: a user's mistake, reported in one line rather than a traceback."""
        try:
            signature = inspect.signature(self.build_graph)
        except (TypeError, ValueError):  # a builtin or C callable: let the call itself check
            signature = None
        if signature is not None:
            try:
                signature.bind(model, **graph_kwargs)
            except TypeError as exc:
                params = ", ".join(signature.parameters)
                raise GraphFileError(
                    f"{self.path}: build_graph({params}) rejected graph_kwargs {sorted(graph_kwargs)}: {exc}"
                ) from exc
        try:
            graph = self.build_graph(model, **graph_kwargs)
        except Exception as exc:
            raise GraphFileError(
                f"{self.path}: build_graph({_short_kwargs(graph_kwargs)}) raised {type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        if not hasattr(graph, "ainvoke"):
            raise GraphFileError(
                f"{self.path}: build_graph returned {type(graph).__name__}, not a runnable graph "
                "(did you forget .compile()?)"
            )
        return graph

    def require_make_input(self) -> Callable[[int], Any]:
        """The file's ``make_input``; a ``GraphFileError`` saying what to define when it has none.

        Call it before starting episodes, so that a missing ``make_input`` stops a run at once
        instead of failing every episode."""
        if self.make_input is None:
            raise GraphFileError(
                f"{self.path} defines no make_input(seed) and the config has no data section: give the "
                "episodes' rows (data.train: rows.jsonl, see docs/train_your_agent.md) or add "
                "`def make_input(seed: int) -> dict` returning the graph's input state for that seed"
            )
        return self.make_input

    @property
    def episode_input(self) -> Callable[[int], Any]:
        """``episode_input(seed)``: the graph input of the episode with ``seed``.

        Reading the attribute already checks the file has ``make_input`` (``require_make_input``),
        so code that hands ``graph_file.episode_input`` to a runner fails before any episode."""
        return self.require_make_input()


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line: its lines joined with ``; ``, cut at ``limit``."""
    text = "; ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip()) or "(no message)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_kwargs(graph_kwargs: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in graph_kwargs.items())
    return text if len(text) <= 120 else text[:117] + "..."


def import_python_file(path: str | Path, what: str = "graph file") -> ModuleType:
    """Import a ``.py`` file by path (executed afresh each call); a ``GraphFileError`` naming
    ``what`` when it is missing or fails to import. A file inside a
    ``graphs/`` folder may import its project's packages (``tools.x``): the project folder is put
    on ``sys.path``."""
    path = Path(path).resolve()
    if not path.is_file():
        raise GraphFileError(f"{what} {str(path)!r} does not exist")
    if path.suffix != ".py":
        raise GraphFileError(f"{what} {str(path)!r} is not a .py file")
    project = path.parent.parent
    if path.parent.name == "graphs" and str(project) not in sys.path:
        sys.path.insert(0, str(project))  # so the file can `import tools.x`
    # elsewhere, its own folder while it is imported, so it can import its neighbours (a graphs/
    # folder is not added: graphs/crafter.py's `import crafter` must find the crafter package)
    neighbours = str(path.parent) if path.parent.name != "graphs" and str(path.parent) not in sys.path else None
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"verlog_file_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if neighbours is not None:
        sys.path.insert(0, neighbours)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise GraphFileError(f"{what} {path} failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        if neighbours is not None and neighbours in sys.path:
            sys.path.remove(neighbours)
    return module


def load_graph_file(path: str | Path) -> GraphFile:
    """Import a graph file by path and check it exposes ``build_graph``."""
    path = Path(path).resolve()
    module = import_python_file(path)
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
