"""Named plug-ins: one registry class for environment families, advantage estimators and policy losses.

Each kind of plug-in has one :class:`Registry`, which maps a name to the object a config or an
environment name refers to:

============================  =============================  ==================================
registry                      entry-point group              register from code
============================  =============================  ==================================
environment families          ``verlog.env_families``        :func:`verlog.envs.register_family`
advantage estimators          ``verlog.estimators``          :func:`verlog.algo.estimators.register_estimator`
policy losses                 ``verlog.policy_losses``       :func:`verlog.algo.loss_registry.register_policy_loss`
============================  =============================  ==================================

**From your own package**, without any code run before verlog reads a config, declare an entry
point in your ``pyproject.toml``; the object is imported the first time verlog looks the name up
(or lists the names)::

    [project.entry-points."verlog.estimators"]
    my_estimator = "my_package.advantages:ESTIMATOR"      # an AdvantageEstimator named my_estimator

    [project.entry-points."verlog.policy_losses"]
    my_loss = "my_package.losses:my_policy_loss"          # takes ppo_policy_loss's arguments

    [project.entry-points."verlog.env_families"]
    mygame = "my_package.game:FAMILY"                     # an EnvFamily named mygame

A name may be registered once: a second registration of a name (an entry point clashing with a
built-in one) is refused, naming both. Entries can be *lazy* (a ``"module:attribute"`` reference,
like an entry point's value): listing names then imports nothing, so the config can check a name
without importing torch.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["ENTRY_POINT_GROUPS", "Registry", "load_reference"]

T = TypeVar("T")

#: the entry-point group of each registry, by the kind of plug-in it holds
ENTRY_POINT_GROUPS: dict[str, str] = {
    "environment family": "verlog.env_families",
    "advantage estimator": "verlog.estimators",
    "policy loss": "verlog.policy_losses",
}


def load_reference(reference: str) -> object:
    """The object a ``"package.module:attribute"`` reference names (an entry point's syntax)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"a reference is 'module:attribute' (got {reference!r})")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


class Registry(Generic[T]):
    """The plug-ins of one kind, by name, in registration order.

    ``kind`` names the plug-in in error messages (``"advantage estimator"``) and picks its
    entry-point group (:data:`ENTRY_POINT_GROUPS`). ``check(name, obj)`` validates an object when
    it is first loaded (raise ``TypeError`` naming what is wrong). ``builtins`` is called once, on
    the first lookup or registration, to register the package's own plug-ins (the lazy way to avoid
    import cycles and heavy imports); entry points are read right after it.
    """

    def __init__(
        self,
        kind: str,
        *,
        check: Callable[[str, object], None] | None = None,
        builtins: Callable[[Registry[T]], None] | None = None,
    ) -> None:
        self.kind = kind
        self.group = ENTRY_POINT_GROUPS[kind]
        self._check = check
        self._builtins = builtins
        self._entries: dict[str, T | str] = {}  # a loaded object, or a lazy "module:attr" reference
        self._sources: dict[str, str] = {}  # where each name came from, for clash errors
        self._lock = threading.RLock()
        self._ready = False

    # -- registration ------------------------------------------------------------------------

    def register(self, name: str, obj: T, *, replace: bool = False, source: str = "register()") -> T:
        """Add ``obj`` as ``name`` (``replace=True`` redeclares a name); returns ``obj``."""
        if self._check is not None:
            self._check(name, obj)
        self._add(name, obj, replace=replace, source=source)
        return obj

    def register_lazy(self, name: str, reference: str, *, replace: bool = False, source: str | None = None) -> None:
        """Add ``name`` as a ``"module:attribute"`` reference, imported on its first lookup."""
        if ":" not in reference:
            raise ValueError(f"a lazy {self.kind} is 'module:attribute' (got {reference!r})")
        self._add(name, reference, replace=replace, source=source or reference)

    def _add(self, name: str, entry: T | str, *, replace: bool, source: str) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty name (got {name!r})")
        self._load_builtins()  # the package's own and the entry points first: a clash with one is refused
        with self._lock:
            if name in self._entries and not replace:
                raise ValueError(
                    f"the {self.kind} {name!r} is already registered (by {self._sources[name]}); "
                    f"{source} cannot register it again"
                )
            self._entries[name] = entry
            self._sources[name] = source

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a ``KeyError`` if it is not registered): for tests and interactive use."""
        self._load_builtins()
        with self._lock:
            del self._entries[name]
            del self._sources[name]

    def _load_builtins(self) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            self._ready = True
            if self._builtins is not None:
                self._builtins(self)
            for point in entry_points(group=self.group):
                dist = getattr(point, "dist", None)
                where = f"the entry point {point.name} = {point.value!r}" + (f" of {dist.name}" if dist else "")
                self.register_lazy(point.name, point.value, source=where)

    # -- lookup ------------------------------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order (imports nothing lazy)."""
        self._load_builtins()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def get(self, name: str) -> T:
        """The plug-in called ``name``; a ``ValueError`` naming the allowed ones otherwise."""
        self._load_builtins()
        entry = self._entries.get(name)
        if entry is None:
            raise ValueError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self._entries)}")
        if isinstance(entry, str):
            with self._lock:
                entry = self._entries[name]
                if isinstance(entry, str):
                    obj = load_reference(entry)
                    if self._check is not None:
                        self._check(name, obj)
                    self._entries[name] = entry = obj  # type: ignore[assignment]
        return entry  # type: ignore[return-value]

    def items(self) -> list[tuple[str, T]]:
        """Every ``(name, plug-in)``, loading the lazy ones."""
        return [(name, self.get(name)) for name in self.names()]
