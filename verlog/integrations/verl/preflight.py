"""Before verl starts: what this machine lacks for the composed config, one line per missing thing.

verl has no CPU backend and reserves Ray resources before it says anything: on a machine without
GPUs, or where Ray sees too few CPUs, ``run_ppo`` hangs silently or fails after minutes in a Ray
traceback. These checks read the composed config and the machine and name the problem at once:

* **GPUs** — ``trainer.n_gpus_per_node`` CUDA devices visible on this node.
* **Ray CPUs** — what a local Ray start will offer (``ray_kwargs.ray_init.num_cpus``, else the
  machine's cores) against what verl holds for the whole run: 1 for its task runner, 1 for the
  TransferQueue controller, 1 per TransferQueue storage unit (2), and 3 per GPU for the worker-group
  bundles of its resource pools (``ResourcePoolManager.max_colocate_count``). A run joining an
  existing cluster (``ray_init.address``) is not checked.
* **flash-attn** — the attention the actor and critic use (``attention_implementation``): with
  ``flash_attention_2`` the package must be importable.
* **rollout engine** — the package of ``actor_rollout_ref.rollout.name`` (sglang or vllm).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "CPUS_PER_GPU",
    "FLASH_ATTENTION",
    "RAY_FIXED_CPUS",
    "Finding",
    "attention_implementation",
    "default_attention",
    "preflight",
]

#: Ray CPUs verl holds whatever the GPU count: task runner, TransferQueue controller, 2 storage units
RAY_FIXED_CPUS = 4
#: Ray CPUs in each GPU's bundle of verl's resource pools (``max_colocate_count``)
CPUS_PER_GPU = 3
#: the attention implementation that needs the flash-attn package
FLASH_ATTENTION = "flash_attention_2"
#: the keys naming the attention of verl's trained models
ATTENTION_KEYS = (
    "actor_rollout_ref.model.override_config.attn_implementation",
    "critic.model.override_config.attn_implementation",
)


@dataclass(frozen=True)
class Finding:
    """One check's result: ``ok`` or not, and its line (``what: the fact; what to do``)."""

    what: str
    ok: bool
    line: str


def has_package(name: str) -> bool:
    """Whether ``name`` is importable here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def default_attention(has: Callable[[str], bool] = has_package) -> str:
    """flash_attention_2 where flash-attn is installed, else PyTorch's sdpa."""
    return FLASH_ATTENTION if has("flash_attn") else "sdpa"


def attention_implementation(config: Any) -> str:
    """The attention implementation of the actor (the composed config's)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.select(config, ATTENTION_KEYS[0]) or FLASH_ATTENTION)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def preflight(
    config: Any,
    *,
    gpus: Callable[[], int] = _cuda_devices,
    cpus: Callable[[], int | None] = os.cpu_count,
    has: Callable[[str], bool] = has_package,
) -> list[Finding]:
    """Every check on ``config`` (a composed verl config) for this machine; ``gpus``, ``cpus``
    and ``has`` say what the machine has (tests pass their own)."""
    from omegaconf import OmegaConf

    select = lambda key, default=None: OmegaConf.select(config, key, default=default)  # noqa: E731
    per_node = int(select("trainer.n_gpus_per_node", 1) or 1)
    found: list[Finding] = []

    visible = gpus()
    where = (
        f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
    )
    if visible >= per_node:
        found.append(Finding("GPUs", True, f"GPUs: {visible} visible, trainer.n_gpus_per_node={per_node}"))
    else:
        found.append(
            Finding(
                "GPUs",
                False,
                (
                    f"GPUs: trainer.n_gpus_per_node={per_node} but {visible} CUDA device(s) are visible here{where}; verl has "
                    "no CPU backend: run on a GPU machine, lower trainer.n_gpus_per_node, or train with the embedded trainer "
                    "(verlog train CONFIG)"
                ),
            )
        )

    need = RAY_FIXED_CPUS + CPUS_PER_GPU * per_node
    address = select("ray_kwargs.ray_init.address")
    if address:
        found.append(Finding("Ray CPUs", True, f"Ray CPUs: joining the cluster at {address} (not checked here)"))
    else:
        configured = select("ray_kwargs.ray_init.num_cpus")
        have = int(configured) if configured is not None else (cpus() or 0)
        source = "ray_kwargs.ray_init.num_cpus" if configured is not None else "the machine's cores"
        ok = have >= need
        line = (
            f"Ray CPUs: {have} ({source}), verl holds {need}: {RAY_FIXED_CPUS} for its task runner, TransferQueue "
            f"controller and 2 storage units, {CPUS_PER_GPU} per GPU for its worker groups"
        )
        if not ok:
            line += (
                f"; give Ray at least {need} (ray_kwargs.ray_init.num_cpus={need} if the machine has the cores, "
                "else fewer GPUs per node)"
            )
        found.append(Finding("Ray CPUs", ok, line))

    attention = attention_implementation(config)
    flash = has("flash_attn")
    if attention == FLASH_ATTENTION and not flash:
        found.append(
            Finding(
                "flash-attn",
                False,
                (
                    "flash-attn: not installed but the actor's attention is flash_attention_2; install it (pip install "
                    "flash-attn --no-build-isolation) or set actor_rollout_ref.model.override_config.attn_implementation=sdpa"
                ),
            )
        )
    elif attention == FLASH_ATTENTION:
        found.append(Finding("flash-attn", True, "flash-attn: installed; actor and critic use flash_attention_2"))
    else:
        state = "installed" if flash else "not installed"
        found.append(
            Finding(
                "flash-attn",
                True,
                (
                    f"flash-attn: {state}; actor and critic use {attention} attention (use_remove_padding off: packed "
                    "sequences need flash_attention_2)"
                ),
            )
        )

    engine = str(select("actor_rollout_ref.rollout.name", "sglang"))
    if has(engine):
        found.append(Finding("rollout engine", True, f"rollout engine: {engine} installed"))
    else:
        found.append(
            Finding(
                "rollout engine",
                False,
                (
                    f"rollout engine: actor_rollout_ref.rollout.name={engine} but the {engine} package is not installed "
                    "(pip install 'verlog[gpu]' installs the stack verl 0.9.1 is tested with; see docs/verl.md)"
                ),
            )
        )
    return found
