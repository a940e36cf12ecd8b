"""One registry class for env families, advantage estimators and policy losses: verlog's own,
another package's through entry points (a real installed distribution, in a child process), and
``register_*`` calls; and the two token-id rules of ``verlog.tokens``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from verlog.algo import gspo_policy_loss, policy_loss_fn, ppo_policy_loss
from verlog.algo.estimators import ESTIMATORS, AdvantageEstimator, Estimate, get_estimator, register_estimator
from verlog.algo.loss_registry import POLICY_LOSSES, policy_loss_names, register_policy_loss
from verlog.config import AlgorithmConfig
from verlog.envs import EnvFamily, families, get_family, list_envs, make_env, register_family
from verlog.envs.registry import FAMILIES
from verlog.registry import Registry, load_reference

ROOT = Path(__file__).resolve().parents[1]


def _zero(batch, data, settings) -> Estimate:
    return Estimate(advantages=torch.zeros_like(batch.token_rewards))


def test_lazy_entries_import_nothing_until_looked_up() -> None:
    registry: Registry[object] = Registry("policy loss")
    registry.register_lazy("json_dumps", "json:dumps")
    assert registry.names()[-1] == "json_dumps" and "json_dumps" in registry
    assert registry.get("json_dumps") is json.dumps
    with pytest.raises(ValueError, match=r"unknown policy loss 'nope'; allowed: .*json_dumps"):
        registry.get("nope")
    with pytest.raises(ValueError, match="'module:attribute'"):
        load_reference("json.dumps")


def test_builtins_are_registered_once_and_clashes_are_refused() -> None:
    assert policy_loss_names()[:2] == ("ppo", "gspo")
    assert policy_loss_fn("ppo") is ppo_policy_loss and policy_loss_fn("gspo") is gspo_policy_loss
    with pytest.raises(ValueError, match=r"the policy loss 'ppo' is already registered \(by verlog\)"):
        register_policy_loss("ppo", ppo_policy_loss)
    with pytest.raises(ValueError, match="the advantage estimator 'grpo' is already registered"):
        register_estimator(get_estimator("grpo"))
    with pytest.raises(ValueError, match="the environment family 'babyai' is already registered"):
        register_family(get_family("babyai"))
    with pytest.raises(TypeError, match="must be a function"):
        register_policy_loss("not_a_function", 3)  # type: ignore[arg-type]
    # the registry itself loads its built-ins before a registration, whoever registers
    fresh: Registry[object] = Registry(
        "policy loss", builtins=lambda r: r.register_lazy("own", "json:dumps", source="verlog")
    )
    with pytest.raises(ValueError, match=r"the policy loss 'own' is already registered \(by verlog\)"):
        fresh.register("own", json.loads)


def test_register_calls_reach_the_config_and_the_lookups() -> None:
    estimator = AdvantageEstimator(
        name="zero_test", summary="test", needs_critic=False, needs=frozenset(), compute=_zero
    )
    register_estimator(estimator)
    register_policy_loss("ppo_test", ppo_policy_loss)
    family = EnvFamily(
        name="toy-registry",
        tasks=("a",),
        make=lambda task, seed, **kw: None,  # type: ignore[arg-type,return-value]
        progression=lambda info: 0.0,
    )
    register_family(family)
    try:
        config = AlgorithmConfig(estimator="zero_test", policy_loss="ppo_test")
        assert get_estimator(config.estimator) is estimator and policy_loss_fn(config.policy_loss) is ppo_policy_loss
        assert "toy-registry:a" in list_envs() and families()["toy-registry"] is family
    finally:
        ESTIMATORS.unregister("zero_test")
        POLICY_LOSSES.unregister("ppo_test")
        FAMILIES.unregister("toy-registry")
    with pytest.raises(ValueError, match="must be one of ppo, gspo"):
        AlgorithmConfig(policy_loss="ppo_test")


def test_a_family_checks_its_task_names_with_one_rule() -> None:
    """``EnvFamily.has_task`` is what both ``make_env`` and the family's own ``make_env`` check."""
    minihack, crafter = get_family("minihack"), get_family("crafter")
    assert minihack.has_task("Corridor-R3") and not minihack.has_task("") and not minihack.has_task("Boxoban-Hard")
    assert crafter.has_task("") and not crafter.has_task("x")
    with pytest.raises(ValueError, match=r"unknown minihack task 'Boxoban-Hard' \(its levels are downloaded"):
        minihack.make_env("Boxoban-Hard")
    with pytest.raises(ValueError, match="'crafter' has no tasks"):
        crafter.make_env("x")
    with pytest.raises(ValueError, match=r"unknown environment 'crafter:x'; valid names: crafter$"):
        make_env("crafter:x")


USER_PACKAGE = """
import torch
from verlog.algo.estimators import AdvantageEstimator, Estimate
from verlog.algo.losses import ppo_policy_loss
from verlog.envs import EnvFamily
from verlog.envs.babyai.env import BabyAITextEnv


def _halved(batch, data, settings):
    return Estimate(advantages=0.5 * batch.token_rewards)


ESTIMATOR = AdvantageEstimator(name="halved", summary="half the reward", needs_critic=False,
                               needs=frozenset(), compute=_halved)


def my_loss(*args, **kwargs):
    loss, metrics = ppo_policy_loss(*args, **kwargs)
    return 2 * loss, {**metrics, "doubled": 1.0}


FAMILY = EnvFamily(name="mygame", tasks=("goto",), make=lambda task, seed, **kw: BabyAITextEnv(task, seed, **kw),
                   progression=lambda info: float(bool(info.get("success"))))
"""

ENTRY_POINTS = """
[verlog.estimators]
halved = my_verlog_plugins:ESTIMATOR

[verlog.policy_losses]
doubled = my_verlog_plugins:my_loss

[verlog.env_families]
mygame = my_verlog_plugins:FAMILY
"""

CHILD = """
import json, torch
from verlog.config import AlgorithmConfig
from verlog.algo import TurnBatch, policy_loss_fn
from verlog.algo.estimators import TurnData, estimate_advantages, estimator_names
from verlog.envs import list_envs, make_env

config = AlgorithmConfig(estimator="halved", policy_loss="doubled", whiten_advantages=False)
rewards = torch.tensor([[[0.0, 1.0]]])
batch = TurnBatch(rewards, torch.ones_like(rewards, dtype=torch.bool), torch.tensor([[True]]), torch.tensor([[False]]))
estimate = estimate_advantages(config, batch, TurnData())
loss, metrics = policy_loss_fn(config.policy_loss)(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.ones(3))
env = make_env("mygame:goto", seed=0)
observation = env.reset()
print(json.dumps({"estimators": list(estimator_names()), "advantages": estimate.advantages.tolist(),
                  "doubled": metrics["doubled"], "envs": [n for n in list_envs() if n.startswith("mygame")],
                  "observation": bool(observation)}))
"""


def test_a_package_plugs_in_through_entry_points(tmp_path: Path) -> None:
    """An installed distribution (a dist-info folder on the path, as pip leaves it) declares an
    estimator, a policy loss and a game; a fresh process finds all three by name."""
    (tmp_path / "my_verlog_plugins.py").write_text(textwrap.dedent(USER_PACKAGE))
    dist = tmp_path / "my_verlog_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-verlog-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["estimators"][-1] == "halved" and "gae" in result["estimators"]
    assert result["advantages"] == [[[0.0, 0.5]]] and result["doubled"] == 1.0
    assert result["envs"] == ["mygame:goto"] and result["observation"]


def test_an_entry_point_clashing_with_a_builtin_is_named(tmp_path: Path) -> None:
    dist = tmp_path / "clash-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clash\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[verlog.estimators]\ngae = json:dumps\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    child = "from verlog.algo.estimators import estimator_names; estimator_names()"
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "the advantage estimator 'gae' is already registered (by verlog)" in out.stderr
    assert "the entry point gae = 'json:dumps' of clash" in out.stderr
