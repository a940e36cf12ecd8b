"""``verlog train --engine verl CONFIG``: compose verl's hydra config with verlog's block, start verl.

A verlog-on-verl config file is verl's own config (any key of verl's packaged ``ppo_trainer``
defaults: ``actor_rollout_ref``, ``critic``, ``algorithm``, ``trainer``, ...) plus

* ``actor_rollout_ref.rollout.multi_turn.langgraph`` / ``chat_template_kwargs``: the graph;
* ``verlog:``: slots, turns per slot, seeds, dual-discount GAE, critic pre-training
  (``verlog.integrations.verl.settings.VerlSettings``; ``verlog.verl_defaults`` picks verl's
  packaged config to start from, ``ppo_trainer`` or ``ppo_megatron_trainer``).

``compose_verl_config`` starts from verl's packaged defaults (hydra's compose API), merges the
file and ``key.path=value`` overrides into them in struct mode, so a misspelt verl key is an
error naming it, then sets what verlog's pieces need (``wire_verlog``): the agent loop and its
registry file, the dataset of slot rows, the trainer, the batch shape. ``launch`` validates the
result with verl's own checks and runs verl's ``run_ppo`` with ``VerlogTaskRunner``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Sequence


from verlog.config import ConfigError, apply_overrides, read_yaml_mapping
from verlog.models import MODEL_SPECS
from verlog.integrations.verl.settings import (
    AGENT_NAME,
    MULTI_TURN_KEY,
    TRAINER_NAME,
    AgentSpec,
    agent_spec,
    resolve_graph_path,
)

__all__ = ["AGENT_LOOPS_FILE", "compose_verl_config", "launch", "wire_verlog"]

#: verl's agent-loop registry file naming verlog's agent loop (installed with the package)
AGENT_LOOPS_FILE = Path(__file__).with_name("agent_loops.yaml")
#: verl's packaged configs a verlog config may start from
VERL_DEFAULTS = ("ppo_trainer", "ppo_megatron_trainer")


def _verl_defaults(name: str) -> Any:
    """verl's packaged hydra config ``name``, composed as ``python -m verl.trainer.main_ppo`` would."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if name not in VERL_DEFAULTS:
        raise ConfigError(f"verlog.verl_defaults: {name!r} is not one of {', '.join(VERL_DEFAULTS)}")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=name)


def compose_verl_config(path: str | Path, overrides: Sequence[str] = ()) -> Any:
    """verl's defaults + the config file + overrides, wired for verlog (an OmegaConf ``DictConfig``)."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from verlog.integrations.verl.multi_turn import TARGET

    path = Path(path)
    data = apply_overrides(read_yaml_mapping(path), overrides)
    verlog_block = data.get("verlog") or {}
    defaults_name = verlog_block.pop("verl_defaults", "ppo_trainer") if isinstance(verlog_block, dict) else "ppo_trainer"
    base = _verl_defaults(str(defaults_name))
    with open_dict(base):  # verlog's additions to verl's schema (free-form: validated by verlog)
        base.verlog = {}
        multi_turn = OmegaConf.select(base, MULTI_TURN_KEY)
        multi_turn._target_ = TARGET
        multi_turn.langgraph = None
        multi_turn.chat_template_kwargs = {}
    for node in (base.verlog, OmegaConf.select(base, MULTI_TURN_KEY)):
        OmegaConf.set_struct(node, False)
    try:
        config = OmegaConf.merge(base, OmegaConf.create(data))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: not a key of verl's {defaults_name} config: {exc}") from None
    graph = OmegaConf.select(config, f"{MULTI_TURN_KEY}.langgraph.path")
    if isinstance(graph, str):
        OmegaConf.update(
            config, f"{MULTI_TURN_KEY}.langgraph.path",
            resolve_graph_path(graph, path.parent.resolve(), path.parent.parent.resolve()),
        )
    user_set = {k for k in _flat_keys(data)}
    wire_verlog(config, keep=user_set)
    return config


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return [prefix.rstrip(".")]
    keys: list[str] = []
    for key, value in data.items():
        keys += _flat_keys(value, f"{prefix}{key}.")
    return keys


def wire_verlog(config: Any, keep: set[str] = frozenset()) -> AgentSpec:
    """Set the verl keys verlog's agent loop, dataset and trainer rely on (in place).

    ``keep``: dotted keys the user set, left as they are where verlog only has a preference
    (e.g. ``actor_rollout_ref.rollout.calculate_log_probs``).
    """
    from omegaconf import OmegaConf, open_dict

    model_path = OmegaConf.select(config, "actor_rollout_ref.model.path")
    if isinstance(model_path, str) and model_path in MODEL_SPECS:  # verlog's offline models by name
        from verlog.models import resolve_model_path

        OmegaConf.update(config, "actor_rollout_ref.model.path", str(resolve_model_path(model_path)))
    spec = agent_spec(config)
    settings = spec.settings
    graph = Path(spec.multi_turn.langgraph.path)
    task = spec.multi_turn.langgraph.graph_kwargs.get("task")
    source = f"{graph.stem}:{task}" if task else graph.stem
    from verlog.integrations.verl.dataset import rows_uri

    forced = {
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(AGENT_LOOPS_FILE.resolve()),
        "data.custom_cls.path": "pkg://verlog.integrations.verl.dataset",
        "data.custom_cls.name": "VerlogRows",
        "data.train_files": rows_uri("slots", settings.num_envs, source),
        "data.val_files": rows_uri("episodes", settings.eval_episodes, source),
        "data.train_batch_size": settings.num_envs,
        "data.shuffle": False,
        "data.gen_batch_size": None,
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_NAME,
    }
    preferred = {
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "data.dataloader_num_workers": 0,
    }
    with open_dict(config):
        for key, value in forced.items():
            OmegaConf.update(config, key, value, force_add=True)
        for key, value in preferred.items():
            if key not in keep:
                OmegaConf.update(config, key, value, force_add=True)
        steps = config.trainer.get("total_training_steps")
        if steps is not None and int(config.trainer.total_epochs) < int(steps):
            config.trainer.total_epochs = int(steps)  # one step per epoch: the dataset is the slots
    return spec


def check_graph(spec: AgentSpec) -> None:
    """Fail in the driver, not in every agent-loop worker, when the graph file cannot be used:
    it must import, take its ``graph_kwargs`` and make episode inputs from seeds."""
    from verlog.graph_file import load_graph_file

    graph_file = load_graph_file(spec.multi_turn.langgraph.path)
    graph_file.episode_input(spec.settings.seed)
    build = graph_file.build_graph
    try:
        inspect.signature(build).bind(None, **spec.multi_turn.langgraph.graph_kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{MULTI_TURN_KEY}.langgraph.graph_kwargs {sorted(spec.multi_turn.langgraph.graph_kwargs)} do not fit "
            f"build_graph{inspect.signature(build)} of {graph_file.path}: {exc}"
        ) from None


def launch(path: str | Path, overrides: Sequence[str] = (), *, dry_run: bool = False, echo: Any = print) -> int:
    """Compose, validate and (unless ``dry_run``) run verl's PPO with verlog's agent and trainer."""
    from hydra.errors import InstantiationException
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from verlog.integrations.verl.trainer import check_verl_config

    config = compose_verl_config(path, overrides)
    spec = check_verl_config(config)
    check_graph(spec)
    auto_set_device(config)
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except (AssertionError, ValueError, InstantiationException) as exc:
        raise ConfigError(f"{path}: verl rejects the composed config: {exc}") from None
    if dry_run:
        echo(OmegaConf.to_yaml(config))
        return 0
    from verl.trainer.main_ppo import run_ppo

    backends = config.trainer.get("logger") or []
    backends = [backends] if isinstance(backends, str) else list(backends)
    if "wandb" in backends and not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_API_KEY"):
        os.environ["WANDB_MODE"] = "offline"  # as verlog's own trainer: no account needed, sync later

    from verlog.integrations.verl.task_runner import VerlogTaskRunner

    echo(
        f"verl: {Path(spec.multi_turn.langgraph.path).name} on {spec.model_path}, "
        f"{spec.settings.num_envs} slots x {spec.settings.turns_per_env or 'whole episodes'} turns"
    )
    run_ppo(config, task_runner_class=VerlogTaskRunner)
    return 0
