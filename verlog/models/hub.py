"""Hugging Face hub ids as model paths, the way ``transformers`` takes them: ``org/name`` is the
snapshot in the local Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``: ``models--org--name/snapshots/<revision>/``, the revision that
``refs/main`` names), downloaded first where the network allows and ``HF_HUB_OFFLINE`` is not set.

Only the files verlog loads are fetched (configs, tokenizer files, safetensors weights): a
snapshot is then checked like any model folder (:mod:`verlog.models.safe_load`).
"""

from __future__ import annotations

import os
from pathlib import Path

from verlog.models.safe_load import first_line

__all__ = ["hub_cache_dir", "hub_offline", "hub_snapshot"]

#: the files of a hub repository verlog reads (pickled weights are never loaded: not fetched)
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, read from the environment at each call."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_snapshot(repo_id: str) -> tuple[Path | None, str]:
    """The local snapshot folder of the hub model ``repo_id`` and ``""``, or ``None`` and why not
    (not a hub id, not in the cache while offline, the download failed)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None, "not a Hugging Face hub id either"
    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True)), ""
    except Exception:  # noqa: BLE001 - not cached (or a broken cache entry): try the hub, or say so
        pass
    where = f"not in the Hugging Face cache {str(cache)!r}"
    if hub_offline():
        return None, f"{where} (HF_HUB_OFFLINE is set: no download)"
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=list(HUB_FILES))), ""
    except Exception as exc:  # noqa: BLE001 - no network, no such repository, a gated one: one line
        return None, f"{where}, and the download failed ({first_line(exc)})"
