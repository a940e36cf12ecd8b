"""``verlog train --engine verl``: the example configs compose with verl's packaged hydra defaults
and pass verl's own validation; bad keys are named; the trainer registers inside verl's task runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ["verl_babyai.yaml", "verl_babaisai.yaml", "verl_crafter.yaml"]
# verl's checks read the model's config: use the offline tiny model instead of a hub download
OFFLINE_MODEL = "actor_rollout_ref.model.path=tiny"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("name", CONFIGS)
def test_example_configs_compose_with_verls_defaults_and_pass_its_checks(name, tiny_dir):
    from verlog.integrations.verl.launch import compose_verl_config, launch
    from verlog.integrations.verl.settings import agent_spec

    printed: list[str] = []
    assert launch(ROOT / "configs" / name, [OFFLINE_MODEL], dry_run=True, echo=printed.append) == 0
    assert "trainer_mode: verlog" in printed[0]

    config = compose_verl_config(ROOT / "configs" / name, [OFFLINE_MODEL])
    spec = agent_spec(config)
    s = spec.settings
    assert config.data.train_batch_size == s.num_envs and config.data.shuffle is False
    assert config.data.train_files == f"verlog://slots/{s.num_envs}?source={config.data.train_files.split('=')[1]}"
    assert config.actor_rollout_ref.model.path == str(tiny_dir) == config.critic.model.path
    assert Path(spec.multi_turn.langgraph.path).is_absolute() and Path(spec.multi_turn.langgraph.path).is_file()
    agent = config.actor_rollout_ref.rollout.agent
    assert agent.default_agent_loop == "verlog_langgraph" and agent.agent_loop_config_path is None
    assert config.actor_rollout_ref.rollout.multi_turn._target_.endswith("VerlogMultiTurnConfig")
    # Verlog's hyper-parameters
    actor, critic, algo = config.actor_rollout_ref.actor, config.critic, config.algorithm
    assert (actor.optim.lr, critic.optim.lr) == (1e-6, 1e-5)
    assert (actor.clip_ratio, actor.clip_ratio_c, critic.cliprange_value) == (0.2, 3.0, 0.5)
    assert (actor.entropy_coeff, actor.ppo_epochs) == (0.001, 1)
    assert algo.use_kl_in_reward and algo.kl_ctrl.kl_coef == 0.001 and algo.adv_estimator == "gae"
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.name, rollout.temperature, rollout.response_length) == ("vllm", 1.0, 512)
    a = s.advantage
    assert (a.gamma_step, a.lam_step, a.gamma_token, a.lam_token) == (0.99, 0.95, 1.0, 1.0)
    assert config.critic.enable is True  # gae trains with a critic: verl builds its worker
    assert (s.critic_warmup.buffer_multiplier, s.critic_warmup.iterations) == (40, 5)
    expected = {"verl_crafter.yaml": (128, 16)}.get(name, (32, 8))
    assert (s.num_envs, s.turns_per_env) == expected


def test_cli_dry_run_prints_pure_yaml_and_needs_no_weights(capsys):
    """The documented dry run, model folder absent: YAML on stdout (it parses), notes on stderr."""
    import yaml

    from verlog.cli import main

    args = ["train", "--engine", "verl", str(ROOT / "configs" / "verl_babyai.yaml"), "verlog.num_envs=16", "--dry-run"]
    assert main(args) == 0
    captured = capsys.readouterr()
    config = yaml.safe_load(captured.out)
    assert config["trainer"]["v1"]["trainer_mode"] == "verlog" and config["data"]["train_batch_size"] == 16
    assert config["actor_rollout_ref"]["model"]["path"] == "/models/Qwen2.5-3B-Instruct"  # printed as given
    assert "not on this machine" in captured.err and "validate_config" in captured.err
    assert main(["train", str(ROOT / "configs" / "quickstart.yaml"), "--dry-run"]) == 2  # embedded: no dry run
    assert "--engine verl" in capsys.readouterr().err


def test_wandb_mode_reaches_every_ray_worker_through_the_runtime_env(monkeypatch):
    """verl logs from its trainer, a Ray actor: WANDB_MODE travels in Ray's runtime env."""
    from verlog.integrations.verl.launch import compose_verl_config

    path = ROOT / "configs" / "verl_babyai.yaml"
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = compose_verl_config(path, [OFFLINE_MODEL, "trainer.logger=[console,wandb]"])
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    config = compose_verl_config(path, [OFFLINE_MODEL, "trainer.logger=[console,wandb]"])
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE == "online"
    config = compose_verl_config(path, [OFFLINE_MODEL, "trainer.logger=[console]"])
    assert "env_vars" not in config.ray_kwargs.ray_init.runtime_env


@pytest.mark.parametrize(
    "override, named",
    [
        ("actor_rollout_ref.actor.clip_ratoi=0.1", "clip_ratoi"),
        ("verlog.advantage.lam_token=0.9", "verlog.advantage.lam_token"),
        ("verlog.gae.lam_token=1.0", "verlog.advantage"),
        ("verlog.num_envs=0", "verlog.num_envs"),
        ("verlog.turns_per_envs=4", "verlog.turns_per_envs"),
        ("actor_rollout_ref.rollout.multi_turn.langgraph.graph_config.recursion_limt=5", "recursion_limt"),
        ("algorithm.adv_estimator=remax", "algorithm.adv_estimator"),
        ("algorithm.adv_estimator=reinforce_plus_plus", "reinforce_pp"),
        ("algorithm.adv_estimator=reinforce_plus_plus_baseline", "reinforce_pp_baseline"),
        ("algorithm.adv_estimator=grpo", "verlog.group_size"),  # groups of one slot: every advantage 0
        ("verlog.group_size=3", "verlog.group_size"),  # does not divide the 32 slots
        ("critic.enable=false", "critic.enable"),
        # babyai's build_graph takes **settings; guess_number's does not take babyai's task
        ("actor_rollout_ref.rollout.multi_turn.langgraph.path=graphs/guess_number.py", "graph_kwargs"),
        # the calculator plays dataset rows: without verlog.data it has no episodes
        ("actor_rollout_ref.rollout.multi_turn.langgraph.path=graphs/calculator.py", "no data section"),
        ("actor_rollout_ref.rollout.multi_turn.langgraph.path=graphs/nope.py", "nope.py"),
    ],
)
def test_bad_keys_are_named(override, named, capsys):
    from verlog.cli import main

    assert (
        main(
            [
                "train",
                "--engine",
                "verl",
                str(ROOT / "configs" / "verl_babyai.yaml"),
                OFFLINE_MODEL,
                override,
                "--dry-run",
            ]
        )
        == 2
    )
    assert named in capsys.readouterr().err.replace("\n", "")


ESTIMATOR_CASES = {
    # name: (overrides, verl builds a critic)
    "gae": ([], True),
    "zero": ([], True),
    "reinforce_pp": ([], False),
    "reinforce_pp_baseline": (["verlog.group_size=8"], False),
    "grpo": (["verlog.group_size=8"], False),
    "rloo": (["verlog.group_size=8"], False),
    "gigpo": (["verlog.group_size=8"], False),
}


def test_every_registered_estimator_is_accepted_and_decides_whether_verl_builds_a_critic(tiny_dir):
    """Each estimator of verlog's registry composes, passes verlog's and verl's checks, and verl
    (its own ``need_critic``, which decides whether the critic worker is created) builds a critic
    exactly when the estimator has one."""
    from verl.trainer.ppo.utils import need_critic

    from verlog.algo.estimators import estimator_names
    from verlog.integrations.verl.launch import compose_verl_config, launch
    from verlog.integrations.verl.trainer import check_verl_config

    assert set(ESTIMATOR_CASES) == set(estimator_names())
    path = ROOT / "configs" / "verl_babyai.yaml"
    for name, (overrides, critic) in ESTIMATOR_CASES.items():
        args = [OFFLINE_MODEL, f"algorithm.adv_estimator={name}", *overrides]
        config = compose_verl_config(path, args)
        assert check_verl_config(config).estimator == name
        assert need_critic(config) is critic, name
        assert launch(path, args, dry_run=True, echo=lambda _: None) == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.adv_estimator=rloo", "verlog.group_size=8", "critic.enable=true"],
            "critic.enable=true: algorithm.adv_estimator=rloo has no critic",
        ),
        (["algorithm.adv_estimator=zero", "critic.enable=false"], "critic.enable=false: algorithm.adv_estimator=zero"),
        (
            ["algorithm.adv_estimator=reinforce_pp", "verlog.advantage.drop_uniform_groups=true"],
            "verlog.advantage.drop_uniform_groups: .* estimator 'reinforce_pp' has no groups",
        ),
        (["algorithm.adv_estimator=gigpo"], "verlog.group_size=1: algorithm.adv_estimator=gigpo compares"),
        (["actor_rollout_ref.rollout.n=2", "verlog.group_size=5"], r"32 x 2 = 64"),
    ],
)
def test_estimator_settings_that_cannot_run_are_refused_in_one_line(overrides, message):
    from verlog.config import ConfigError
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.trainer import check_verl_config

    with pytest.raises(ConfigError, match=message) as err:
        check_verl_config(compose_verl_config(ROOT / "configs" / "verl_babyai.yaml", [OFFLINE_MODEL, *overrides]))
    assert "\n" not in str(err.value)


def test_a_config_without_a_graph_is_refused(tmp_path):
    from verlog.config import ConfigError
    from verlog.integrations.verl.launch import compose_verl_config

    path = tmp_path / "c.yaml"
    path.write_text("actor_rollout_ref: {model: {path: tiny}}\n")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.multi_turn\.langgraph is missing"):
        compose_verl_config(path)


FRESH_INTERPRETER = """
import sys
import verl.trainer.ppo.v1.trainer_base as base
from omegaconf import OmegaConf
from verl.experimental.agent_loop import agent_loop as al
from verl.trainer.main_ppo import TaskRunnerV1
from verl.utils.dataset.rl_dataset import get_dataset_class
from verlog.integrations.verl.task_runner import VerlogTaskRunner, VerlogTaskRunnerClass

# the trainer: registered by verlog's task runner, before verl's own run looks it up
assert "verlog" not in base.TRAINER_REGISTRY
found = {}
TaskRunnerV1.__ray_actor_class__.run = lambda self, config: found.update(
    cls=base.get_trainer_cls(config.trainer.v1.trainer_mode))
VerlogTaskRunnerClass().run(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "verlog"}}}))
print("trainer", found["cls"].__name__, VerlogTaskRunner.__ray_actor_class__ is VerlogTaskRunnerClass)

# the agent loop: registered where verl's AgentLoopWorker loads the dataset class, no file path
assert "verlog_langgraph" not in al._agent_loop_registry
config = OmegaConf.load(sys.argv[1])
assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path is None
get_dataset_class(config.data)  # what verl's AgentLoopWorker.__init__ does
print("agent_loop", al._agent_loop_registry["verlog_langgraph"]["_target_"])
"""


@pytest.fixture(scope="module")
def fresh_interpreter(tmp_path_factory, tiny_dir):
    """A fresh interpreter (as a Ray actor or worker process on any node is) given the composed
    config: what it prints, by line key."""
    from omegaconf import OmegaConf

    from verlog.integrations.verl.launch import compose_verl_config

    config = compose_verl_config(ROOT / "configs" / "verl_babyai.yaml", [OFFLINE_MODEL])
    path = tmp_path_factory.mktemp("fresh") / "composed.yaml"
    path.write_text(OmegaConf.to_yaml(config))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", FRESH_INTERPRETER, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.strip()}


def test_the_trainer_registers_inside_verls_task_runner(fresh_interpreter):
    """Running verlog's task runner makes trainer_mode "verlog" resolvable by verl's registry before
    verl's own run looks it up."""
    assert fresh_interpreter["trainer"] == ["VerlogPPOTrainer", "True"]


def test_every_agent_loop_worker_knows_the_agent_loop_by_package_name(fresh_interpreter):
    """verl's agent-loop worker set up from the composed config finds ``verlog_langgraph``: the
    config names no file path for it (a path would have to exist on every node)."""
    assert fresh_interpreter["agent_loop"] == ["verlog.integrations.verl.agent_loop.LangGraphAgentLoop"]
