"""Checkpoints of a training run: written atomically, found again by ``--resume`` and ``verlog eval``.

Layout of ``<run_dir>/checkpoints/update_000010/``::

    actor/                 the policy as a Hugging Face folder (safetensors + tokenizer): loadable
                           anywhere a model path is taken (``model.path=...``, ``verlog eval``)
    actor_adapter/         with LoRA: the adapters (``actor/`` is then absent; base = model.path)
    critic.safetensors     the critic (backbone + value head)
    optimizers.json        actor and critic optimizer states: hyper-parameters and structure ...
    optimizers.safetensors ... and their tensors (Adam moments, step counts)
    rng.json               torch / python / numpy RNG states and named generators (the engine's
    rng.safetensors        sampling generator, the mini-batch shuffle)
    state.json             update number, slot and episode counters, wandb run id

Nothing in a checkpoint is a pickle: loading one never runs code. A folder holding pickled
``optimizers.pt`` / ``rng.pt`` (older verlog, other tools) is refused with ``CheckpointError``.

A checkpoint is read as untrusted input (the model folders inside it by
:mod:`verlog.models.safe_load`): ``latest`` must name a checkpoint of the run, no file read may be
a link out of the run or a device, JSON files are size- and depth-bounded, and
:func:`verify_checkpoint` checks the whole folder (files, tensors of ``actor/``) before a resumed
run writes anything. Every refusal is one ``CheckpointError`` line naming the file.

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

from verlog.models.safe_load import (
    MAX_JSON_BYTES,
    CheckpointError,
    check_adapter_folder,
    check_model_folder,
    check_tensors,
    first_line,
    folder_file,
    load_checked_tokenizer,
    read_json,
    safetensors_header,
)

__all__ = [
    "CheckpointError",
    "checkpoint_dirs",
    "get_rng_state",
    "latest_checkpoint",
    "load_critic_weights",
    "ACTOR_FOLDER",
    "ADAPTER_FOLDER",
    "load_optimizers",
    "load_rng",
    "read_state",
    "resolve_checkpoint",
    "save_checkpoint",
    "set_rng_state",
    "verify_checkpoint",
]

#: the checkpoint's policy: a Hugging Face folder (full fine-tuning) or LoRA adapters on model.path
ACTOR_FOLDER = "actor"
ADAPTER_FOLDER = "actor_adapter"
#: the critic's file in a checkpoint (absent when the estimator has no critic)
CRITIC_FILE = "critic.safetensors"

_NAME = re.compile(r"^update_(\d+)$")
#: written in every ``*.json`` part beside its tensors; a file without it is not ours
_FORMAT = "verlog-checkpoint"
_VERSION = 1


# ---------------------------------------------------------------------- finding checkpoints


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _update_dirs(run_dir: Path) -> list[Path]:
    """The run's ``update_NNNNNN`` entries (complete or not, links included), oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted((p for p in root.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name).group(1)))


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run (real folders with a ``state.json``), oldest first."""
    return [p for p in _update_dirs(run_dir) if not p.is_symlink() and p.is_dir() and (p / "state.json").is_file()]


def _latest_name(root: Path) -> str | None:
    """The checkpoint name ``checkpoints/latest`` holds (``None`` without the file); anything but
    an ``update_NNNNNN`` of this folder is refused."""
    if not os.path.lexists(root / "latest"):
        return None
    pointer = folder_file(root, "latest", limit=4096)
    if pointer.is_symlink():
        raise CheckpointError(f"{pointer} is a symbolic link: it must be a file naming a checkpoint of the run")
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{pointer}: unreadable ({first_line(exc)})") from None
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"{pointer} names {name[:80]!r}, not a checkpoint of this run (update_NNNNNN)")
    return name


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to resume or evaluate: the one ``checkpoints/latest`` names (else the newest
    ``update_NNNNNN``), or ``None`` when the run saved none.

    Raises :class:`CheckpointError` rather than guess when the run's checkpoints cannot be trusted:
    ``latest`` naming something else than a checkpoint of the run, a checkpoint that is a link or
    has no readable ``state.json``, a ``checkpoints`` folder that is a link."""
    root = checkpoints_root(run_dir)
    if root.is_symlink():
        raise CheckpointError(f"{root} is a symbolic link: a run's checkpoints must be inside its folder")
    if not root.is_dir():
        return None
    name = _latest_name(root)
    dirs = _update_dirs(run_dir)
    if name is None and not dirs:
        return None
    chosen = root / name if name is not None else dirs[-1]
    if chosen.is_symlink() or not chosen.is_dir():
        what = "a symbolic link" if chosen.is_symlink() else "missing"
        raise CheckpointError(f"{chosen}: the run's latest checkpoint is {what}")
    read_state(chosen)
    return chosen


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder (its latest checkpoint) or a checkpoint folder -> the checkpoint folder."""
    path = Path(path)
    if os.path.lexists(path / "state.json"):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {str(path)!r} (expected a run folder or a checkpoint folder)")
    return latest


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The counters saved with a checkpoint (``state.json``)."""
    path = Path(checkpoint) / "state.json"
    state = read_json(path)
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("update"), int)
        or isinstance(state["update"], bool)
        or state["update"] < 0
    ):
        raise CheckpointError(f"{path}: not a verlog checkpoint state (a JSON object with an 'update' number)")
    return state


def verify_checkpoint(checkpoint: Path) -> dict[str, Any]:
    """Check a whole checkpoint folder before anything is loaded or written: its state, the
    actor (``actor/``: files, tensors and the tokenizer with its chat template, which must render
    a conversation in the sandbox; or ``actor_adapter/``), the critic's and the optimizers'
    files, the RNG states. Returns its state. What needs this run's models to be checked (the
    adapters', the critic's and the optimizers' tensors, the slots' counters) is checked as it is
    loaded."""
    checkpoint = Path(checkpoint)
    state = read_state(checkpoint)
    name = _NAME.fullmatch(checkpoint.name)
    if name is not None and int(name.group(1)) != state["update"]:
        raise CheckpointError(
            f"{checkpoint / 'state.json'}: update {state['update']}, but the folder is {checkpoint.name}"
        )
    if os.path.lexists(checkpoint / ADAPTER_FOLDER):
        check_adapter_folder(folder_file(checkpoint, ADAPTER_FOLDER))
    else:
        check_model_folder(folder_file(checkpoint, ACTOR_FOLDER))
        # (a resume trains with model.path's tokenizer, yet this one is what the run's checkpoints
        # are served and evaluated with: refused by every loader alike)
        load_checked_tokenizer(folder_file(checkpoint, ACTOR_FOLDER))
    if os.path.lexists(checkpoint / CRITIC_FILE):
        safetensors_header(folder_file(checkpoint, CRITIC_FILE))
    _part_files(checkpoint, "optimizers")
    load_rng(checkpoint)
    return state


# ---------------------------------------------------------------------- RNG states


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
    """Put back the RNG states ``get_rng_state`` returned (named generators matched by name)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, generator in (extra or {}).items():
        if name in state["generators"]:
            generator.set_state(state["generators"][name])


# ---------------------------------------------------------------------- saving


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
        save_file({k: v.detach().contiguous().cpu() for k, v in critic.state_dict().items()}, tmp / CRITIC_FILE)
    _save_tree({k: o.state_dict() for k, o in optimizers.items() if o is not None}, tmp, "optimizers")
    _save_tree(rng, tmp, "rng")
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


# ---------------------------------------------------------------------- loading


def load_critic_weights(critic: torch.nn.Module, checkpoint: Path) -> None:
    """Load ``critic.safetensors`` into ``critic`` (a mismatch is a ``CheckpointError``)."""
    path = Path(checkpoint) / CRITIC_FILE
    if not os.path.lexists(path):
        raise CheckpointError(
            f"{checkpoint} has no critic.safetensors: it was saved without a critic "
            "(an estimator without a critic?); resume with the estimator it was trained with"
        )
    folder_file(path.parent, path.name)
    expected = {k: tuple(v.shape) for k, v in critic.state_dict().items()}
    check_tensors(safetensors_header(path), expected, [], path)
    try:
        critic.load_state_dict(load_file(path))
    except Exception as exc:  # a corrupt file, or another model's shapes
        raise CheckpointError(
            f"{path} does not fit this run's critic (was model.path changed?): {first_line(exc)}"
        ) from None


def load_optimizers(checkpoint: Path, optimizers: dict[str, torch.optim.Optimizer | None]) -> None:
    """Restore each named optimizer saved in ``checkpoint`` (names absent there are left as they are)."""
    states = _load_tree(Path(checkpoint), "optimizers")
    if not isinstance(states, dict):
        raise CheckpointError(f"{checkpoint}/optimizers.json: not a mapping of optimizer states")
    for name, optimizer in optimizers.items():
        if optimizer is not None and name in states:
            try:
                optimizer.load_state_dict(states[name])
                _check_shapes(optimizer)
            except Exception as exc:  # other parameter groups or sizes: another model or LoRA setting
                raise CheckpointError(
                    f"{checkpoint}: the saved {name} optimizer does not fit this run's "
                    f"{name} (was model.path, actor.lora or {name}.train_layers changed?): {first_line(exc)}"
                ) from None


def _check_shapes(optimizer: torch.optim.Optimizer) -> None:
    """Per-parameter state (Adam moments) must have its parameter's shape; torch checks only counts."""
    for group in optimizer.param_groups:
        for i, param in enumerate(group["params"]):
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(
                        f"state {key!r} of parameter {i} has shape {tuple(value.shape)}, "
                        f"the parameter {tuple(param.shape)}"
                    )


def load_rng(checkpoint: Path) -> dict[str, Any]:
    """The RNG states saved in ``checkpoint``, as ``get_rng_state`` returned them."""
    rng = _load_tree(Path(checkpoint), "rng")
    if (
        not isinstance(rng, dict)
        or not {"torch", "python", "numpy", "generators"} <= set(rng)
        or not isinstance(rng["generators"], dict)
    ):
        raise CheckpointError(f"{checkpoint}/rng.json: not verlog RNG states")
    try:  # each state is tried on a scratch generator: a bad one fails here, not half-way through set_rng_state
        torch.Generator().set_state(rng["torch"])
        random.Random().setstate(rng["python"])
        np.random.RandomState().set_state(rng["numpy"])
        for state in rng["generators"].values():
            torch.Generator().set_state(state)
        if "cuda" in rng and torch.cuda.is_available():
            for state in rng["cuda"]:
                torch.Generator().set_state(state)
    except Exception as exc:
        raise CheckpointError(f"{checkpoint}/rng.json: not verlog RNG states ({first_line(exc)})") from None
    return rng


# ---------------------------------------------------------------------- pickle-free trees
# A tree of dicts, lists, tuples, scalars, numpy arrays and tensors is stored as JSON (its shape
# and scalars) plus one safetensors file (its tensors, referenced by key from the JSON).


def _save_tree(tree: Any, folder: Path, part: str) -> None:
    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": _FORMAT, "version": _VERSION, "part": part, "tree": _encode(tree, tensors, part)}
    save_file(tensors, folder / f"{part}.safetensors")
    (folder / f"{part}.json").write_text(json.dumps(doc))


def _part_files(folder: Path, part: str) -> tuple[Path, Path]:
    """The ``.json`` and ``.safetensors`` files of a pickle-free part, checked (a pickled ``.pt``
    left instead is refused by name)."""
    doc_path = folder / f"{part}.json"
    if not os.path.lexists(doc_path):
        if os.path.lexists(folder / f"{part}.pt"):
            raise CheckpointError(
                f"{folder}: {part}.pt is a pickle file (written by an older verlog or another tool) and "
                "verlog does not load pickles, which can run code; start a new trainer.run_dir "
                f"(its weights can seed it: model.path={folder / ACTOR_FOLDER})"
            )
        raise CheckpointError(f"{folder} is not a complete verlog checkpoint: {part}.json is missing")
    folder_file(folder, doc_path.name, limit=MAX_JSON_BYTES)
    tensor_path = folder_file(folder, f"{part}.safetensors")
    safetensors_header(tensor_path)
    return doc_path, tensor_path


def _load_tree(folder: Path, part: str) -> Any:
    doc_path, tensor_path = _part_files(folder, part)
    doc = read_json(doc_path)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("part") != part:
        raise CheckpointError(f"{doc_path} is not a verlog checkpoint file (written by another tool?)")
    if not isinstance(doc.get("version"), int) or doc["version"] > _VERSION:
        raise CheckpointError(
            f"{doc_path}: checkpoint format version {doc.get('version')!r} is newer than "
            f"this verlog reads ({_VERSION}); upgrade verlog"
        )
    try:
        tensors = load_file(tensor_path)
    except Exception as exc:  # truncated or not safetensors
        raise CheckpointError(f"{tensor_path}: unreadable ({first_line(exc)})") from None
    try:
        return _decode(doc.get("tree"), tensors, doc_path)
    except RecursionError:
        raise CheckpointError(f"{doc_path}: nested too deep to be verlog's") from None
    except (TypeError, ValueError, OverflowError) as exc:  # an array of strings, a bad dtype, ...
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{doc_path}: not a verlog checkpoint file ({first_line(exc)})") from None


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "biuf":
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors, where)
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, where) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors, where) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, where) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, where)] for k, v in obj.items()]}
    raise TypeError(
        f"{where}: cannot save a {type(obj).__name__} in a checkpoint (tensors, arrays, "
        "numbers, strings, lists, tuples and dicts only)"
    )


def _decode(obj: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, path) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        if obj["__tensor__"] not in tensors:
            raise CheckpointError(f"{path}: tensor {obj['__tensor__']!r} is missing from its .safetensors file")
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        dtype = np.dtype(str(obj.get("dtype")))
        if dtype.kind not in "biuf":
            raise CheckpointError(f"{path}: array dtype {obj.get('dtype')!r} is not numeric")
        return np.asarray(obj["__ndarray__"], dtype=dtype)
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors, path) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_hashable(_decode(k, tensors, path), path): _decode(v, tensors, path) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors, path) for k, v in obj.items()}


def _hashable(key: Any, path: Path) -> Any:
    if isinstance(key, (list, dict, torch.Tensor, np.ndarray)):
        raise CheckpointError(f"{path}: a mapping key is not a scalar")
    return key
