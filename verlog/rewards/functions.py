"""Reward functions named in a config (``reward.functions``), loaded and called safely.

A reward function is any Python function, sync or async, in a file (``rewards.py:correct``) or an
installed module (``my_pkg.rewards:correct``). It is called once an episode ends, with the
keyword arguments its signature names, taken from:

* the episode (``verlog.rewards.Trajectory``): ``state`` (the graph's final state), ``messages``
  (its ``messages``), ``completion`` (the last AI message's text), ``prompt`` (the first human
  message's text), ``row`` (the dataset row), ``key`` (row index or seed), ``turns`` (the recorded
  model calls), ``info`` (what the graph reported), ``trajectory`` (all of it);
* the row's columns, by name (``answer``, ``reward_model``...);
* verl's names (``VERL_FIELDS``), so a verl ``compute_score(data_source, solution_str,
  ground_truth, extra_info=None)`` works unchanged: ``solution_str`` is ``completion``,
  ``ground_truth`` the row's ``reward_model.ground_truth``, ``data_source`` and ``extra_info``
  the row's columns (``None`` and ``{}`` when it has none);
* the entry's ``kwargs`` in the config.

A ``**kwargs`` parameter receives all of them, except in a function of verl's shape (one that
names ``solution_str``, as verl's ``default_compute_score(data_source, solution_str, ground_truth,
extra_info=None, **kwargs)`` does): it is called as verl's reward manager calls it, its
``**kwargs`` receiving only verl's arguments it does not name and the entry's ``kwargs``. It returns a real number (Python, numpy or torch
scalar), a bool (reward 1/0 and success), a dict with ``reward`` (and ``success``,
``turn_rewards``, ``info``), verl's dict (``score`` and other keys, kept in ``info``) or a
``RewardResult``. A sync function runs in a worker thread, so a slow one does not stall the other
episodes. Raising, returning something else or running past ``timeout_s`` is a ``RewardError``:
the episode is recorded as failed, never trained with a made-up reward.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from verlog.config import ConfigError, RewardFunctionConfig
from verlog.graph_file import GraphFileError, import_python_file
from verlog.rewards.result import RewardResult, Trajectory, as_result

__all__ = ["TRAJECTORY_FIELDS", "VERL_FIELDS", "RewardError", "RewardFunction", "load_function", "verl_arguments"]

#: the keyword arguments every reward function may take, besides the row's columns
TRAJECTORY_FIELDS = ("state", "messages", "completion", "prompt", "row", "key", "turns", "info", "trajectory")
#: the keyword arguments verl's reward manager passes to ``compute_score``
VERL_FIELDS = ("data_source", "solution_str", "ground_truth", "extra_info")
#: the argument that marks a function of verl's shape: its ``**kwargs`` get what verl passes, no more
VERL_MARK = "solution_str"
#: the row column verl's ``ground_truth`` is read from (``row[...]["ground_truth"]``)
VERL_REWARD_MODEL_COLUMN = "reward_model"


def verl_arguments(trajectory: Trajectory) -> dict[str, Any]:
    """verl's arguments of ``compute_score`` for one episode: ``solution_str`` (the final answer,
    ``completion``), ``ground_truth`` (the row's ``reward_model.ground_truth``, absent when the
    row has none), ``data_source`` and ``extra_info`` (the row's columns, else ``None`` / ``{}``)."""
    row = dict(trajectory.row or {})
    extra = row.get("extra_info")
    found: dict[str, Any] = {
        "solution_str": trajectory.completion,
        "data_source": row.get("data_source"),
        "extra_info": dict(extra) if isinstance(extra, Mapping) else ({} if extra is None else extra),
    }
    spec = row.get(VERL_REWARD_MODEL_COLUMN)
    if "ground_truth" in row:
        found["ground_truth"] = row["ground_truth"]
    elif isinstance(spec, dict) and "ground_truth" in spec:
        found["ground_truth"] = spec["ground_truth"]
    return found


class RewardError(RuntimeError):
    """A reward function or judge failed on one episode (raised, timed out, returned nonsense):
    the episode is failed, not scored. ``reason`` says how in one word, for counting (a judge's:
    ``unparsable``, ``unavailable``, ``refused``, ``no_reference``; otherwise ``error``)."""

    def __init__(self, message: str, reason: str = "error"):
        super().__init__(message)
        self.reason = reason


def load_function(target: str, where: str = "reward.functions", what: str = "reward file") -> Callable[..., Any]:
    """The callable named by ``file.py:name`` or ``package.module:name``; ``ConfigError`` naming
    ``where`` (and the file as ``what``) otherwise."""
    module_name, _, name = target.rpartition(":")
    try:
        if module_name.endswith(".py") or "/" in module_name or Path(module_name).is_file():
            module = import_python_file(module_name, what=what)
        else:
            module = importlib.import_module(module_name)
    except GraphFileError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import {module_name!r}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise ConfigError(
            f"{where}: {module_name} has no function {name!r} (its functions: {', '.join(found) or 'none'})"
        )
    return function


class RewardFunction:
    """One configured reward function: call it on a ``Trajectory`` to get a checked ``RewardResult``."""

    def __init__(self, config: RewardFunctionConfig, where: str = "reward.functions"):
        self.config = config
        self.where = where
        self.function = load_function(config.function, where)
        self.name = config.name or getattr(self.function, "__name__", "reward")
        self.weight = config.weight
        try:
            self.signature = inspect.signature(self.function)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {config.function} has no inspectable signature") from None
        params = self.signature.parameters.values()
        positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
        if positional:
            raise ConfigError(
                f"{where}: {config.function} takes positional-only arguments {positional}; "
                "reward functions are called with keyword arguments"
            )
        self.takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        #: verl's shape: a ``**kwargs`` that receives only what verl's reward manager passes
        self.verl_shaped = VERL_MARK in self.signature.parameters
        self.wanted = [
            p.name
            for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        self.required = [
            p.name
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        self.is_async = inspect.iscoroutinefunction(self.function)

    def check_arguments(self, columns: Iterable[str] = ()) -> None:
        """Refuse, before any episode, an argument that nothing will provide (``ConfigError``)."""
        columns = list(columns)
        known = set(TRAJECTORY_FIELDS) | set(columns) | set(self.config.kwargs)
        known |= set(VERL_FIELDS) - {"ground_truth"}  # always given; ground_truth only with the rows' column
        if VERL_REWARD_MODEL_COLUMN in columns:
            known.add("ground_truth")
        missing = [name for name in self.required if name not in known]
        if missing:
            cols = ", ".join(columns) or "none: no data section"
            hint = ""
            if "ground_truth" in missing:
                hint = (
                    f"; verl's ground_truth is read from the rows' {VERL_REWARD_MODEL_COLUMN}.ground_truth (verl's "
                    "data format) or a ground_truth column, or give it in kwargs"
                )
            raise ConfigError(
                f"{self.where}: {self.config.function} needs {', '.join(repr(m) for m in missing)}, which is neither an "
                f"episode field ({', '.join(TRAJECTORY_FIELDS)}), one of verl's ({', '.join(VERL_FIELDS)}), "
                f"a column of the rows ({cols}) nor one of its kwargs{hint}"
            )

    def arguments(self, trajectory: Trajectory) -> dict[str, Any]:
        """The keyword arguments of a call on ``trajectory``."""
        available: dict[str, Any] = verl_arguments(trajectory)
        available.update(trajectory.row or {})
        available.update(
            {
                "state": trajectory.state,
                "messages": trajectory.messages,
                "completion": trajectory.completion,
                "prompt": trajectory.prompt,
                "row": trajectory.row,
                "key": trajectory.key,
                "turns": list(trajectory.turns),
                "info": dict(trajectory.info),
                "trajectory": trajectory,
            }
        )
        available.update(self.config.kwargs)
        if self.takes_all and not self.verl_shaped:
            return available
        named = {name: available[name] for name in self.wanted if name in available}
        if self.takes_all:  # verl's call: its four arguments and the entry's kwargs, nothing else
            verl = {k: v for k, v in verl_arguments(trajectory).items() if k in VERL_FIELDS}
            return {**verl, **self.config.kwargs, **named}
        return named

    async def __call__(self, trajectory: Trajectory) -> RewardResult:
        kwargs = self.arguments(trajectory)
        label = f"reward function {self.name} ({self.config.function})"
        try:
            if self.is_async:
                call = self.function(**kwargs)
            else:
                call = asyncio.to_thread(self.function, **kwargs)
            value = await asyncio.wait_for(call, timeout=self.config.timeout_s)
        except asyncio.TimeoutError:
            raise RewardError(f"{label} took longer than {self.config.timeout_s} s (timeout_s)") from None
        except Exception as exc:
            raise RewardError(f"{label} raised {type(exc).__name__}: {exc}") from exc
        try:
            return as_result(value, len(trajectory.turns))
        except (TypeError, ValueError) as exc:
            raise RewardError(f"{label}: {exc}") from None
