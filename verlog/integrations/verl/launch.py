"""``verlog train --engine verl CONFIG``: compose verl's hydra config with verlog's block, start verl.

A verlog-on-verl config file is verl's own config (any key of verl's packaged ``ppo_trainer``
defaults: ``actor_rollout_ref``, ``critic``, ``algorithm``, ``trainer``, ...) plus

* ``actor_rollout_ref.rollout.multi_turn.langgraph`` / ``chat_template_kwargs``: the graph;
* ``verlog:``: slots, turns per slot, seeds and slot groups, the estimator's settings, critic
  pre-training (the estimator itself is ``algorithm.adv_estimator``, one of verlog's registry)
  (``verlog.integrations.verl.settings.VerlSettings``; ``verlog.verl_defaults`` picks verl's
  packaged config to start from, ``ppo_trainer`` or ``ppo_megatron_trainer``).

``compose_verl_config`` starts from verl's packaged defaults (hydra's compose API), merges the
file and ``key.path=value`` overrides into them in struct mode, so a misspelt verl key is an
error naming it, then sets what verlog's pieces need (``wire_verlog``): the agent loop, the
dataset of slot rows (whose module registers the agent loop in verl's workers), the trainer,
the batch shape, whether verl builds a critic (``critic.enable``: exactly when the estimator has
one), the Ray runtime environment, the attention of the trained models (``wire_attention``).
``launch`` validates the result with verl's own checks, runs the pre-flight checks
(:mod:`verlog.integrations.verl.preflight`: GPUs, Ray CPUs, flash-attn, the rollout engine; one
line each, a missing one stops the launch before Ray starts) and runs verl's ``run_ppo`` with
``VerlogTaskRunner``; ``launch(..., dry_run=True)`` prints the composed config as YAML on stdout
and everything else (the pre-flight lines included) on stderr, and needs no model weights.

**Attention.** verl loads the actor, reference and critic with
``*.model.override_config.attn_implementation`` (its default: ``flash_attention_2``, which needs the
flash-attn package). verlog leaves a value you set alone and otherwise picks
``flash_attention_2`` where flash-attn is installed, PyTorch's ``sdpa`` where it is not. Packed
sequences (``use_remove_padding``) need flash_attention_2, so they are turned off with any other
attention; asking for both is refused.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from verlog.config import ConfigError, apply_overrides, read_yaml_mapping
from verlog.integrations.verl.preflight import (
    ATTENTION_KEYS,
    FLASH_ATTENTION,
    default_attention,
    has_package,
    preflight,
)
from verlog.integrations.verl.settings import (
    AGENT_NAME,
    MULTI_TURN_KEY,
    TRAINER_NAME,
    AgentSpec,
    adopt_verl_keys,
    agent_spec,
    resolve_graph_path,
    resolve_source_paths,
)
from verlog.models import MODEL_SPECS

__all__ = ["compose_verl_config", "launch", "ray_env_vars", "wire_verlog"]

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
    for note in adopt_verl_keys(data):
        print(f"note: {note}", file=sys.stderr)
    verlog_block = data.get("verlog") or {}
    defaults_name = (
        verlog_block.pop("verl_defaults", "ppo_trainer") if isinstance(verlog_block, dict) else "ppo_trainer"
    )
    resolve_source_paths(verlog_block, path.parent.resolve(), path.parent.parent.resolve())
    base = _verl_defaults(str(defaults_name))
    with open_dict(base):  # verlog's additions to verl's schema (free-form: validated by verlog)
        base.verlog = {}
        multi_turn = OmegaConf.select(base, MULTI_TURN_KEY)
        multi_turn._target_ = TARGET
        multi_turn.langgraph = None
        multi_turn.chat_template_kwargs = {}
    # free-form nodes: verlog's block, the multi-turn block, and the models' override_config
    # dicts (verl passes their keys to transformers, e.g. attn_implementation)
    free = [base.verlog, OmegaConf.select(base, MULTI_TURN_KEY)]
    free += [node for key in _OVERRIDE_CONFIGS if (node := OmegaConf.select(base, key)) is not None]
    for node in free:
        OmegaConf.set_struct(node, False)
    try:
        config = OmegaConf.merge(base, OmegaConf.create(data))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: not a key of verl's {defaults_name} config: {exc}") from None
    graph = OmegaConf.select(config, f"{MULTI_TURN_KEY}.langgraph.path")
    if isinstance(graph, str):
        OmegaConf.update(
            config,
            f"{MULTI_TURN_KEY}.langgraph.path",
            resolve_graph_path(graph, path.parent.resolve(), path.parent.parent.resolve()),
        )
    user_set = {k for k in _flat_keys(data)}
    wire_verlog(config, keep=user_set)
    wire_attention(config, keep=user_set)
    env = ray_env_vars(config, os.environ)
    if env:
        with open_dict(config):
            for name, value in env.items():
                OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}", value, force_add=True)
    return config


def ray_env_vars(config: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables every Ray worker of the run needs (``ray_kwargs.ray_init.runtime_env.env_vars``).

    verl logs from its trainer, a Ray actor that may run on another node and does not see the
    launcher's environment. With the ``wandb`` logger: the launcher's ``WANDB_MODE`` when set,
    else ``offline`` when no ``WANDB_API_KEY`` is set (as verlog's own trainer: no account
    needed, ``wandb sync`` later). With the ``file`` logger (one JSON line of metrics per step):
    the launcher's ``VERL_FILE_LOGGER_PATH`` / ``VERL_FILE_LOGGER_ROOT``, which say where it writes.
    A value already in the config is kept.
    """
    from omegaconf import OmegaConf

    backends = OmegaConf.select(config, "trainer.logger") or []
    backends = [backends] if isinstance(backends, str) else list(backends)
    env: dict[str, str] = {}
    if "wandb" in backends:
        mode = environ.get("WANDB_MODE") or ("" if environ.get("WANDB_API_KEY") else "offline")
        if mode:
            env["WANDB_MODE"] = mode
    if "file" in backends:
        env.update({k: environ[k] for k in ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT") if environ.get(k)})
    existing = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    return {k: v for k, v in env.items() if k not in existing}


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
        # the agent loop registers itself where the dataset class loads (verlog.integrations.verl.dataset)
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": None,
        "data.custom_cls.path": "pkg://verlog.integrations.verl.dataset",
        "data.custom_cls.name": "VerlogRows",
        "data.train_files": rows_uri("slots", settings.num_envs, source),
        "data.val_files": rows_uri("episodes", settings.validation_episodes(), source),
        "data.train_batch_size": settings.num_envs,
        "data.shuffle": False,
        "data.gen_batch_size": None,
        # rows carry the slots' episode counters the trainer updates: read them in its process
        "data.dataloader_num_workers": 0,
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_NAME,
    }
    preferred = {
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        # verl builds its critic worker when critic.enable says so (else only for its own "gae"):
        # exactly when verlog's estimator has a critic (check_verl_config refuses a contradiction)
        "critic.enable": _estimator_has_critic(spec.estimator),
    }
    for key, value in forced.items():
        if key in keep and OmegaConf.select(config, key) != value:
            print(
                f"note: {key}={OmegaConf.select(config, key)} is set by verlog to {value!r} "
                f"({FORCED_WHY.get(key.split('.')[0], 'verlog runs the agent loop and the trainer')})",
                file=sys.stderr,
            )
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


#: why verlog sets the keys of a section whatever the config says (the note printed when it differs)
FORCED_WHY = {
    "data": "verl's rows name verlog's env slots, which play verlog.data's rows or make_input(seed); a batch is "
    "every slot once: size it with verlog.num_envs",
    "trainer": "verlog's trainer trains the per-turn samples",
}


#: verl's per-model dicts of Hugging Face config overrides (actor/reference, critic)
_OVERRIDE_CONFIGS = ("actor_rollout_ref.model.override_config", "critic.model.override_config")
#: each trained model's packed-sequence switch
_REMOVE_PADDING = ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding")


def wire_attention(config: Any, keep: set[str] = frozenset(), has: Callable[[str], bool] = has_package) -> str:
    """Set the actor's and critic's attention (in place) and return it: the one the config names
    (``actor_rollout_ref.model.override_config.attn_implementation``; the critic follows unless its
    own is set), else flash_attention_2 where flash-attn is installed and sdpa where not. Without
    flash_attention_2, packed sequences (``use_remove_padding``) are turned off; a config that asks
    for them is refused."""
    from omegaconf import OmegaConf, open_dict

    chosen = OmegaConf.select(config, ATTENTION_KEYS[0])
    attention = str(chosen) if chosen else default_attention(has)
    with open_dict(config):
        for key in ATTENTION_KEYS:
            if not OmegaConf.select(config, key):
                OmegaConf.update(config, key, attention, force_add=True)
        for attention_key, padding_key in zip(ATTENTION_KEYS, _REMOVE_PADDING):
            if OmegaConf.select(config, attention_key) == FLASH_ATTENTION:
                continue
            if padding_key in keep and OmegaConf.select(config, padding_key):
                raise ConfigError(
                    f"{padding_key}: packed sequences need flash_attention_2, but {attention_key} is "
                    f"{OmegaConf.select(config, attention_key)}; set {padding_key}=false (or install flash-attn "
                    "and use flash_attention_2)"
                )
            OmegaConf.update(config, padding_key, False, force_add=True)
    return attention


def _estimator_has_critic(name: str) -> bool:
    from verlog.algo.estimators import get_estimator

    return get_estimator(name).needs_critic


def check_graph(spec: AgentSpec) -> None:
    """Fail in the driver, not in every agent-loop worker, when the graph file cannot be used:
    it must import, take its ``graph_kwargs`` and make episode inputs (from seeds, or from the
    rows of ``verlog.data``), and the reward functions of ``verlog.reward`` must load and find
    their arguments."""
    from verlog.data import load_tasks
    from verlog.episodes import build_scorer
    from verlog.graph_file import load_graph_file

    graph_file = load_graph_file(spec.multi_turn.langgraph.path)
    load_tasks(spec.settings, graph_file, "train").task(spec.settings.seed)

    def no_model_here(name: str) -> Any:  # the driver only checks the judges; the workers run them
        raise RuntimeError(f"the launcher does not run judges (embedded: {name})")

    build_scorer(spec.settings, chat_model_for=no_model_here)
    build = graph_file.build_graph
    try:
        inspect.signature(build).bind(None, **spec.multi_turn.langgraph.graph_kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{MULTI_TURN_KEY}.langgraph.graph_kwargs {sorted(spec.multi_turn.langgraph.graph_kwargs)} do not fit "
            f"build_graph{inspect.signature(build)} of {graph_file.path}: {exc}"
        ) from None


def launch(path: str | Path, overrides: Sequence[str] = (), *, dry_run: bool = False, echo: Any = print) -> int:
    """Compose, validate and (unless ``dry_run``) run verl's PPO with verlog's agent and trainer.

    ``dry_run``: validate, then ``echo`` the composed config as YAML and start nothing. Messages
    (verl's included, and the pre-flight lines) go to stderr; a model folder that is not on this
    machine is replaced, for verl's checks only, by verlog's offline ``tiny`` model (verl's checks
    read the model's config), and a note on stderr says so. Without ``dry_run``, a failed
    pre-flight check stops the launch with a ``ConfigError`` naming each missing thing.
    """
    from omegaconf import OmegaConf

    from verlog.integrations.verl.trainer import check_verl_config

    config = compose_verl_config(path, overrides)
    spec = check_verl_config(config)
    check_graph(spec)
    if dry_run:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints its notices
            _validate(config, path, stand_in=True)
        for finding in preflight(config):
            print(f"pre-flight: {'ok' if finding.ok else 'MISSING'}: {finding.line}", file=sys.stderr)
        echo(OmegaConf.to_yaml(config).rstrip("\n"))
        return 0
    _validate(config, path, stand_in=False)
    findings = preflight(config)
    missing = [f.line for f in findings if not f.ok]
    if missing:
        raise ConfigError("verl cannot start on this machine:\n  " + "\n  ".join(missing))
    for finding in findings:
        echo(f"pre-flight: {finding.line}")
    from verl.trainer.main_ppo import run_ppo

    from verlog.integrations.verl.task_runner import VerlogTaskRunner

    echo(
        f"verl: {Path(spec.multi_turn.langgraph.path).name} on {spec.model_path}, "
        f"{spec.settings.num_envs} slots x {spec.settings.turns_per_env or 'whole episodes'} turns"
    )
    run_ppo(config, task_runner_class=VerlogTaskRunner)
    return 0


#: the config keys naming model folders that verl's checks load
_MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "critic.model.tokenizer_path")


def _validate(config: Any, path: str | Path, *, stand_in: bool) -> None:
    """verl's own ``validate_config`` on the composed config (a ``ConfigError`` naming the file).

    ``stand_in``: model folders that do not exist here are swapped, for the check only, for
    verlog's offline ``tiny`` model; the config itself is left as it is.
    """
    import copy

    from hydra.errors import InstantiationException
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    checked = config
    if stand_in:
        missing = [
            (key, value)
            for key in _MODEL_KEYS
            if isinstance(value := OmegaConf.select(config, key), str) and value and not Path(value).exists()
        ]
        if missing:
            from verlog.models import resolve_model_path

            tiny = str(resolve_model_path("tiny"))
            checked = copy.deepcopy(config)
            for key, _ in missing:
                OmegaConf.update(checked, key, tiny)
            print(
                f"note: {missing[0][1]} is not on this machine: verl's checks ran with verlog's tiny model in its "
                "place (batch sizes and parallelism are checked, the model's own config is not)",
                file=sys.stderr,
            )
    try:
        validate_config(checked, use_reference_policy=need_reference_policy(checked), use_critic=need_critic(checked))
    except (AssertionError, ValueError, InstantiationException) as exc:
        raise ConfigError(f"{path}: verl rejects the composed config: {exc}") from None
