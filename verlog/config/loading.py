"""Reading a config: a YAML file, its overrides applied, validated into a ``VerlogConfig`` with
errors that name every bad key; relative paths resolved against the config's folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from verlog.config.base import ConfigError
from verlog.config.data import SPLITS
from verlog.config.overrides import apply_overrides
from verlog.config.root import VerlogConfig

if TYPE_CHECKING:
    pass


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The field names allowed at the parent of ``loc`` (None when it is a free-form dict)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return None
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields is not None else None


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    """A pydantic ``ValidationError`` of ``model`` as lines ``  dotted.key: what is wrong`` (an
    unknown key with the keys allowed there, a missing one, a bad value with what was given)."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc)
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {key}: unknown key{hint}")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = f" (got {err.get('input')!r})" if loc else ""  # not the whole file
            lines.append(f"  {key}: {msg}{got}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], *, source: str = "<config>") -> VerlogConfig:
    """Validate a mapping as a ``VerlogConfig``; raise ``ConfigError`` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    if "actor_rollout_ref" in data:
        raise ConfigError(
            f"{source} is a verl config (it has actor_rollout_ref): train it with "
            f"`verlog train --engine verl {source}` (see docs/verl.md); verlog's other commands "
            "take verlog configs such as configs/babyai.yaml"
        )
    try:
        return VerlogConfig.model_validate(data)
    except ValidationError as exc:
        lines = describe_errors(exc, VerlogConfig).splitlines()
        if len(lines) == 1:  # one bad key: one line
            raise ConfigError(f"invalid config {source}: {lines[0].strip()}") from None
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(lines)) from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (an empty file is ``{}``); a clear ``ConfigError`` for
    a missing file, invalid YAML or a top level that is not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> VerlogConfig:
    """Read a YAML config file, apply ``key=value`` overrides, validate.

    A relative ``multi_turn.langgraph.path`` is resolved against the current directory first,
    then against the config file's folder and its parent (so configs/x.yaml may say graphs/x.py).
    """
    path = Path(path)
    config = config_from_dict(apply_overrides(read_yaml_mapping(path), overrides), source=str(path))
    bases = (path.parent, path.parent.parent)
    config.multi_turn.langgraph.path = resolve_path(config.multi_turn.langgraph.path, bases)
    if config.data is not None:
        for name in SPLITS:
            source = config.data.split(name)
            if source is not None:
                source.path = resolve_path(source.path, bases)
    for function in config.reward.functions:
        target, _, name = function.function.rpartition(":")
        if target.endswith(".py"):
            function.function = f"{resolve_path(target, bases)}:{name}"
    responder = config.multi_turn.langgraph.on_interrupt
    if responder and responder.rpartition(":")[0].endswith(".py"):
        target, _, name = responder.rpartition(":")
        config.multi_turn.langgraph.on_interrupt = f"{resolve_path(target, bases)}:{name}"
    return config


def resolve_path(path: str, bases: Sequence[Path]) -> str:
    """A relative ``path`` as given when it exists from the current directory, else joined to the
    first of ``bases`` where it exists (a config's folder and its parent: configs/x.yaml may say
    graphs/x.py or data/x.jsonl); unchanged when it exists nowhere (the error comes on use).
    Globs (``data/*.jsonl``) are kept as given."""
    if Path(path).is_absolute() or Path(path).exists() or any(c in path for c in "*?["):
        return path
    for base in bases:
        if (base / path).exists():
            return str(base / path)
    return path
