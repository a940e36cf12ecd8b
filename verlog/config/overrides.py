"""``key.path=value`` overrides of a config (values read as YAML), as the command line gives them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import yaml

from verlog.config.base import ConfigError

if TYPE_CHECKING:
    pass


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=[x, y]"]`` -> ``[(["a", "b"], 1), (["c"], ["x", "y"])]`` (values as YAML)."""
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {exc}") from exc
        parsed.append((key.strip().split("."), value))
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each dotted key in a copy of ``data`` (intermediate sections are created)."""
    data = yaml.safe_load(yaml.safe_dump(data)) or {}
    for path, value in parse_overrides(overrides):
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data
