"""Checkpoints of a training run: written atomically, found again by ``--resume`` and ``verlog eval``.

Layout of ``<run_dir>/checkpoints/update_000010/``::

    actor/                 the policy as a Hugging Face folder (safetensors + tokenizer): loadable
                           anywhere a model path is taken (``model.path=...``, ``verlog eval``)
    actor_adapter/         with LoRA: the adapters (``actor/`` is then absent; base = model.path)
    critic.safetensors     the critic (backbone + value head)
    optimizers.pt          actor and critic optimizer states
    rng.pt                 torch / python / numpy RNG states and the engine's sampling generator
    state.json             update number, slot and episode counters, wandb run id

A checkpoint is built in a temporary folder and renamed into place, then ``checkpoints/latest``
names it; a run killed at any moment keeps every checkpoint it had completed.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = [
    "checkpoint_dirs",
    "get_rng_state",
    "latest_checkpoint",
    "load_critic_weights",
    "read_state",
    "resolve_checkpoint",
    "save_checkpoint",
    "set_rng_state",
]

_NAME = re.compile(r"^update_(\d+)$")


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, else the newest complete one, else ``None``."""
    root = checkpoints_root(run_dir)
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if (named / "state.json").is_file():
            return named
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder (its latest checkpoint) or a checkpoint folder -> the checkpoint folder."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {str(path)!r} (expected a run folder or a checkpoint folder)")
    return latest


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / "state.json").read_text())


def get_rng_state(extra: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG a run draws from: torch (CPU and CUDA), python, numpy, and named generators."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generators": {name: g.get_state() for name, g in (extra or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], extra: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, generator in (extra or {}).items():
        if name in state["generators"]:
            generator.set_state(state["generators"][name])


def save_checkpoint(
    run_dir: Path,
    update: int,
    *,
    save_actor: Callable[[Path], None],
    critic: torch.nn.Module | None,
    optimizers: dict[str, torch.optim.Optimizer | None],
    rng: dict[str, Any],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint ``update`` atomically, point ``latest`` at it, drop all but ``keep``."""
    root = checkpoints_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"update_{update:06d}"
    final = root / name
    for stale in root.glob(".tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    tmp.mkdir()
    save_actor(tmp)
    if critic is not None:
        save_file({k: v.detach().contiguous().cpu() for k, v in critic.state_dict().items()}, tmp / "critic.safetensors")
    torch.save({k: o.state_dict() for k, o in optimizers.items() if o is not None}, tmp / "optimizers.pt")
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "update": update}, indent=1))
    if final.exists():  # re-saving the same update (a resumed run): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".latest-{os.getpid()}"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_critic_weights(critic: torch.nn.Module, checkpoint: Path) -> None:
    critic.load_state_dict(load_file(Path(checkpoint) / "critic.safetensors"))


def load_optimizers(checkpoint: Path, optimizers: dict[str, torch.optim.Optimizer | None]) -> None:
    states = torch.load(Path(checkpoint) / "optimizers.pt", weights_only=False)
    for name, optimizer in optimizers.items():
        if optimizer is not None and name in states:
            optimizer.load_state_dict(states[name])


def load_rng(checkpoint: Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / "rng.pt", weights_only=False)
