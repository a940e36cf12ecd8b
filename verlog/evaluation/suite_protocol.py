"""Is an evaluation still its suite's protocol? Every setting that differs from it, named.

A suite file (``configs/suites/balrog.yaml``) *is* a protocol: each task's graph settings (the
suite's ``graph_kwargs``, its own and its entry's) and the config settings of its ``overrides``.
Anything else that reaches a task — ``--graph-kwargs``, ``key=value`` overrides of a config's
``graph_kwargs``, a key the config file itself sets, a changed episode time limit or recursion
limit, fewer episodes than the suite asks for — makes the scores not the suite's.
:func:`protocol_differences` names each such setting:

* a graph setting the suite gives, with another value (dictionaries compared key by key,
  ``settings.level``);
* a graph setting the suite does not give, unless it equals the graph's own default: the
  default of ``build_graph``'s parameter of that name, or, for a setting passed on through
  ``**settings`` to the game, ``None`` (the game's own default); so ``level``, ``pool_size``,
  ``default_action`` ... given at all are named;
* a config setting of the suite's ``overrides`` with another value, any run-config key
  (``multi_turn.langgraph.graph_config``, e.g. ``recursion_limit``) the suite does not set, and
  ``eval.episodes`` below the suite's number (BALROG's episode counts are minimums).

``balrog_source`` (where BALROG's wording comes from) is not compared as a setting: any BALROG the
user gives is BALROG's wording, and ``verlog eval`` reports which one (:func:`wording_report`).
But a BALROG-protocol task of the suite played *without* one (no ``--balrog``) speaks verlog's
paraphrase of BALROG's instructions, answer rule and invalid-answer note and plays verlog's
regenerated TextWorld games: its prompts are not BALROG's, so ``balrog_source``
(:data:`NO_BALROG_SOURCE`) is named too.

BALROG's vision protocol (``verlog eval --vision``, :func:`with_vision`) is the same suite with one
more setting, ``max_image_history`` (:mod:`verlog.envs.balrog_vision`): BALROG's VLM value, 1, in
every BALROG-protocol task. Under it any other value is named; without it, any value but the text
protocol's 0 (given or not).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Iterable, Mapping, Sequence

from verlog.envs import balrog_vision
from verlog.evaluation.tasks import EvalTask, load_suite

__all__ = [
    "NO_BALROG_SOURCE",
    "PROVENANCE_KEYS",
    "protocol_differences",
    "suite_settings",
    "vision_report",
    "with_vision",
    "wording_report",
]

#: graph settings that say where texts come from, not how a game is played
PROVENANCE_KEYS = frozenset({"balrog_source"})
#: named when a BALROG-protocol task of the suite runs without the user's BALROG (verlog's wording)
NO_BALROG_SOURCE = "balrog_source"
_MISSING = object()


def suite_settings(suite: str) -> dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]]:
    """``(env, task) -> (the suite's graph_kwargs of the task, the suite's config overrides)``."""
    settings: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
    for env, _path, tasks, overrides in load_suite(suite):
        pinned = {}
        for item in overrides:
            key, _, raw = item.partition("=")
            pinned[key] = json.loads(raw)
        for task in tasks or [{"name": env, "graph_kwargs": {}}]:
            settings[(env, str(task["name"]))] = (dict(task.get("graph_kwargs") or {}), pinned)
    return settings


def _graph_defaults(build_graph: Any) -> tuple[dict[str, Any], bool]:
    """``build_graph``'s parameters with their defaults (``_MISSING`` without one), and whether it
    passes other settings on (``**settings``)."""
    try:
        parameters = list(inspect.signature(build_graph).parameters.values())[1:]  # after the model
    except (TypeError, ValueError):
        return {}, True
    named = {
        p.name: (p.default if p.default is not inspect.Parameter.empty else _MISSING)
        for p in parameters
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def _differing(name: str, value: Any, expected: Any) -> list[str]:
    """``[name]`` (or its differing sub-keys) when ``value`` is not ``expected``."""
    if isinstance(value, Mapping) and isinstance(expected, (Mapping, type(None))):
        expected = expected or {}
        keys = sorted(set(value) | set(expected), key=str)
        return [f"{name}.{k}" for k in keys if value.get(k, _MISSING) != expected.get(k, _MISSING)]
    return [] if value == expected else [name]


def graph_differences(graph_kwargs: Mapping[str, Any], suite_kwargs: Mapping[str, Any], build_graph: Any) -> list[str]:
    """The graph settings of a task that are not its suite's (see the module docstring)."""
    defaults, _ = _graph_defaults(build_graph)
    changed: list[str] = []
    for key in sorted(set(graph_kwargs) | set(suite_kwargs)):
        if key in PROVENANCE_KEYS:
            continue
        value = graph_kwargs.get(key, _MISSING)
        if key in suite_kwargs:
            expected = suite_kwargs[key]
        else:
            expected = defaults.get(key, None)
            if expected is _MISSING:
                changed.append(key)
                continue
        if value is _MISSING:  # the suite sets it and something dropped it
            changed.append(key)
            continue
        changed += _differing(key, value, expected)
    return changed


def _config_value(task: EvalTask, dotted: str) -> Any:
    node: Any = task.config
    for part in dotted.split("."):
        node = node.get(part, _MISSING) if isinstance(node, Mapping) else getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def config_differences(task: EvalTask, pinned: Mapping[str, Any], episodes: int | None) -> list[str]:
    """The config settings of a task that are not its suite's (see the module docstring)."""
    changed: list[str] = []
    for key, expected in pinned.items():
        if key == "eval.episodes":
            played = episodes if episodes is not None else task.config.eval.episodes
            if expected is not None and played is not None and played < expected:
                changed.append(key)
            continue
        if _config_value(task, key) != expected:
            changed.append(key)
    graph_config = task.config.multi_turn.langgraph.graph_config or {}
    prefix = "multi_turn.langgraph.graph_config"
    for key in sorted(graph_config):
        dotted = f"{prefix}.{key}"
        if dotted not in pinned and pinned.get(prefix, {}).get(key, _MISSING) != graph_config[key]:
            changed.append(dotted)
    return changed


def protocol_differences(
    tasks: Sequence[EvalTask], suite: str, episodes: int | None = None, vision: bool = False
) -> list[str]:
    """Every setting, over the suite's tasks, that differs from the suite's protocol (sorted,
    each named once). ``episodes``: ``--episodes`` when given; ``vision``: the protocol is the
    suite's under BALROG's vision protocol (``--vision``)."""
    from verlog.graph_file import load_graph_file

    settings = suite_settings(suite)
    builders: dict[str, Any] = {}
    changed: set[str] = set()
    for task in tasks:
        if task.key not in settings:
            continue  # a task of a config given beside the suite: no protocol to keep
        suite_kwargs, pinned = settings[task.key]
        path = task.config.multi_turn.langgraph.path
        if path not in builders:
            builders[path] = load_graph_file(path).build_graph
        graph_kwargs = task.graph_kwargs
        if suite_kwargs.get("protocol") == "balrog":
            key = balrog_vision.SETTING
            expected = balrog_vision.IMAGE_HISTORY if vision else suite_kwargs.get(key, balrog_vision.TEXT_ONLY)
            if graph_kwargs.get(key, balrog_vision.TEXT_ONLY) != expected:
                changed.add(key)
            graph_kwargs = {k: v for k, v in graph_kwargs.items() if k != key}
            suite_kwargs = {k: v for k, v in suite_kwargs.items() if k != key}
        changed.update(graph_differences(graph_kwargs, suite_kwargs, builders[path]))
        changed.update(config_differences(task, pinned, episodes))
        if task.graph_kwargs.get("protocol") == "balrog" and not task.graph_kwargs.get("balrog_source"):
            changed.add(NO_BALROG_SOURCE)
    return sorted(changed)


def balrog_tasks(tasks: Iterable[EvalTask]) -> list[EvalTask]:
    """The tasks played under BALROG's protocol."""
    return [t for t in tasks if t.graph_kwargs.get("protocol") == "balrog"]


def with_vision(tasks: Iterable[EvalTask]) -> list[EvalTask]:
    """Turn BALROG's vision protocol on in the BALROG-protocol tasks: ``max_image_history`` 1
    (BALROG's VLM mode) where the task does not set it itself (``--graph-kwargs`` can, and is then
    named as off the protocol). The tasks it applies to."""
    playing = balrog_tasks(tasks)
    for task in playing:
        task.graph_kwargs.setdefault(balrog_vision.SETTING, balrog_vision.IMAGE_HISTORY)
    return playing


def vision_report(tasks: Iterable[EvalTask]) -> dict[str, Any]:
    """What ``summary.json`` says about images in the BALROG-protocol tasks: BALROG's text protocol,
    or its vision protocol with each task's ``max_image_history``."""
    key = balrog_vision.SETTING
    images = {t.label: t.graph_kwargs.get(key, balrog_vision.TEXT_ONLY) for t in balrog_tasks(tasks)}
    if not any(images.values()):
        return {"balrog_images": "none (BALROG's text protocol)"}
    return {"balrog_images": "BALROG's vision protocol", key: images}


def wording_report(source: Any) -> dict[str, Any]:
    """What ``summary.json`` says about the wording of BALROG-protocol tasks: BALROG's own, read
    from ``source`` (its provenance), or verlog's (``source=None``)."""
    if source is None:
        return {
            "balrog_wording": "verlog",
            "balrog_wording_note": "verlog's wording of BALROG's instructions, answer rule and invalid-answer "
            "note (same facts, other words), and verlog's regenerated TextWorld games; "
            "give --balrog PATH (or $VERLOG_BALROG) to use BALROG's own",
        }
    return {"balrog_wording": "balrog", "balrog_source": source.provenance()}
