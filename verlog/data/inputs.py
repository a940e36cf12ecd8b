"""How a dataset row becomes a graph's input.

Two ways, chosen per graph file:

* the graph file defines ``make_input(row)`` (a parameter that is not ``seed`` and not annotated
  ``int``): it is called with the row, a plain dict, and returns the input state;
* otherwise the ``data.input`` mapping builds a ``messages`` state, what LangGraph's prebuilt
  agents (``create_react_agent``, ``create_agent``) and most chat graphs take: the ``prompt``
  column (a string is one user message; a list of ``{role, content}`` dicts or LangChain messages
  is a conversation), an optional ``system`` message first, and more state keys copied from
  columns (``state: {target: answer}``). So a production graph trains on a file with no code.

A ``make_input(seed)`` makes procedurally generated episodes (the games): with a data section it
is not used.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, convert_to_messages

from verlog.config import DataInputConfig
from verlog.data.files import DataError
from verlog.graph_file import GraphFile

__all__ = ["input_maker", "makes_input_from_row", "messages_input"]


def makes_input_from_row(make_input: Callable[..., Any] | None) -> bool:
    """Whether a graph file's ``make_input`` takes a row (not a seed): its first parameter is
    neither named ``seed`` nor annotated ``int``."""
    if make_input is None:
        return False
    try:
        params = list(inspect.signature(make_input).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    first = params[0]
    return first.name != "seed" and first.annotation not in (int, "int")


def messages_input(row: dict[str, Any], spec: DataInputConfig) -> dict[str, Any]:
    """The ``messages`` input state of ``row`` under the ``data.input`` mapping ``spec``."""
    prompt = row[spec.prompt]
    if isinstance(prompt, str):
        messages: list[BaseMessage] = [HumanMessage(prompt)]
    elif isinstance(prompt, (list, tuple)) and prompt:
        try:
            messages = list(convert_to_messages(list(prompt)))
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise ValueError(f"column {spec.prompt!r} is not a list of chat messages: {exc}") from None
    else:
        raise ValueError(
            f"column {spec.prompt!r} must hold a string or a non-empty list of chat messages, got {type(prompt).__name__}"
        )
    if spec.system:
        messages.insert(0, SystemMessage(spec.system))
    return {"messages": messages, **{key: row[column] for key, column in spec.state.items()}}


def input_maker(graph_file: GraphFile, spec: DataInputConfig, columns: list[str], split: str) -> Callable[[dict], Any]:
    """``row -> graph input`` for ``graph_file`` on a split with ``columns``: its ``make_input(row)``,
    else the ``data.input`` mapping, whose columns are checked here (``DataError`` naming the key)."""
    if makes_input_from_row(graph_file.make_input):
        return graph_file.make_input  # type: ignore[return-value]
    wanted = {"data.input.prompt": spec.prompt, **{f"data.input.state.{k}": c for k, c in spec.state.items()}}
    for key, column in wanted.items():
        if column not in columns:
            raise DataError(
                f"{key}: column {column!r} is not in data.{split} (its columns: {', '.join(columns)}); name the "
                f"column to use, or define make_input(row) in {graph_file.path.name}"
            )
    return lambda row: messages_input(row, spec)
