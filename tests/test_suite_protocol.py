"""The "not the suite's protocol" flag names every setting that differs from the suite's, whatever
changed it (``verlog.evaluation.suite_protocol``).

For every task of BALROG's suite, every setting its graph accepts — ``build_graph``'s own
parameters, and for the games that pass settings on, ``build_game_graph``'s and the game
constructor's — is changed in turn and must be named; so must a changed episode time limit,
recursion limit, or fewer episodes than BALROG's. Settings left as the suite has them, and
defaults given explicitly, are not named.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from verlog.envs.agent_graph import build_game_graph
from verlog.envs.registry import make_env
from verlog.evaluation.suite_protocol import NO_BALROG_SOURCE, PROVENANCE_KEYS, protocol_differences
from verlog.evaluation.tasks import plan_tasks
from verlog.graph_file import load_graph_file

ROOT = Path(__file__).resolve().parents[1]


def _params(function, skip: int) -> list[inspect.Parameter]:
    return [
        p
        for p in list(inspect.signature(function).parameters.values())[skip:]
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def accepted_keys(task) -> list[str]:
    """Every setting the task's graph accepts (see the module docstring)."""
    build_graph = load_graph_file(ROOT / task.config.multi_turn.langgraph.path).build_graph
    keys = [p.name for p in _params(build_graph, 1)]
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(build_graph).parameters.values()):
        keys += [p.name for p in _params(build_game_graph, 2)]
        env_name = task.env if not task.graph_kwargs.get("task") else f"{task.env}:{task.graph_kwargs['task']}"
        keys += [
            p.name
            for p in _params(type(make_env(env_name, protocol="balrog")).__init__, 1)
            if p.name not in ("task", "seed")
        ]
    return sorted(set(keys) - PROVENANCE_KEYS)


def suite_tasks(overrides: list[str] | None = None, configs: list[str] | None = None):
    """The suite's tasks as ``verlog eval --balrog PATH`` plays them (BALROG's own wording)."""
    tasks = plan_tasks(configs or [], overrides or [], suite="balrog")
    for task in tasks:
        if task.graph_kwargs.get("protocol") == "balrog":
            task.graph_kwargs["balrog_source"] = {"path": "/somewhere/BALROG", "sha256": "0" * 64}
    return tasks


def _one_task_per_env():
    tasks = suite_tasks()
    seen: dict[str, object] = {}
    for task in tasks:
        seen.setdefault(task.env, task)
    return list(seen.values())


TASKS = _one_task_per_env()


def test_the_suite_as_written_is_its_own_protocol() -> None:
    assert protocol_differences(suite_tasks(), "balrog") == []
    assert protocol_differences(suite_tasks(), "balrog", episodes=50) == []  # more is fine


def test_the_suite_without_the_users_balrog_is_not_its_protocol() -> None:
    # no --balrog: verlog's wording and regenerated TextWorld games, not BALROG's prompts
    assert protocol_differences(plan_tasks([], [], suite="balrog"), "balrog") == [NO_BALROG_SOURCE]
    tasks = suite_tasks()
    del tasks[0].graph_kwargs["balrog_source"]  # one task without it is enough
    assert protocol_differences(tasks, "balrog") == [NO_BALROG_SOURCE]
    assert protocol_differences(tasks[1:], "balrog") == []


@pytest.mark.parametrize("task", TASKS, ids=[t.env for t in TASKS])
def test_every_graph_setting_changed_is_named(task) -> None:
    keys = accepted_keys(task)
    assert {"protocol", "history_turns", "max_tokens", "max_steps", "invalid_action_penalty"} <= set(keys)
    base = dict(task.graph_kwargs)
    try:
        for key in keys:
            task.graph_kwargs = {**base, key: f"changed-{key}"}
            assert key in protocol_differences([task], "balrog"), (task.env, key)
    finally:
        task.graph_kwargs = base


@pytest.mark.parametrize("key,value", [("default_action", "turn left"), ("layout", "maze"), ("instruction", "hi")])
def test_babyai_settings_the_suite_leaves_alone_are_named(key: str, value: str) -> None:
    [task] = [t for t in suite_tasks() if t.label == "babyai/goto"]
    task.graph_kwargs = {**task.graph_kwargs, key: value}
    assert protocol_differences([task], "balrog") == [key]


def test_textworld_generator_settings_are_named_key_by_key() -> None:
    [task] = [t for t in suite_tasks() if t.label == "textworld/coin_collector"]
    task.graph_kwargs = {**task.graph_kwargs, "settings": {"level": 20, "pool_size": 5}}
    assert protocol_differences([task], "balrog") == ["settings.level", "settings.pool_size"]


def test_config_overrides_and_the_configs_own_keys_are_named_too() -> None:
    overrides = [
        "rollout.episode_timeout_s=600",
        "multi_turn.langgraph.graph_config.recursion_limit=50",
        'multi_turn.langgraph.graph_kwargs.default_action="turn left"',
    ]
    tasks = [t for t in suite_tasks(overrides) if t.env == "babyai"]
    assert protocol_differences(tasks, "balrog") == [
        "default_action",
        "multi_turn.langgraph.graph_config.recursion_limit",
        "rollout.episode_timeout_s",
    ]
    assert "eval.episodes" in protocol_differences(tasks[:1], "balrog", episodes=2)  # BALROG's are minimums


def test_explicit_defaults_and_the_wording_source_are_not_differences() -> None:
    tasks = {t.env: t for t in suite_tasks()}
    minihack = tasks["minihack"]
    minihack.graph_kwargs = {
        **minihack.graph_kwargs,
        "show_map": False,
        "invalid_action_penalty": None,
        "balrog_source": "/somewhere/BALROG",
    }
    assert protocol_differences([minihack], "balrog") == []
    minihack.graph_kwargs["show_map"] = True
    assert protocol_differences([minihack], "balrog") == ["show_map"]


def test_a_config_beside_the_suite_is_not_checked() -> None:
    tasks = suite_tasks(configs=[str(ROOT / "configs" / "guess_number.yaml")])
    assert protocol_differences(tasks, "balrog") == []
