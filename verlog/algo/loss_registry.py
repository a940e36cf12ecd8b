"""The policy losses ``algorithm.policy_loss`` chooses from, by name (torch-free: the config reads it).

verlog's own are ``ppo`` (:func:`verlog.algo.losses.ppo_policy_loss`, a ratio per token) and
``gspo`` (:func:`verlog.algo.losses.gspo_policy_loss`, one ratio per turn). A loss of your own takes
the same arguments and returns ``(loss, metrics)``; add it with :func:`register_policy_loss` or a
``verlog.policy_losses`` entry point (``my_loss = "my_package.losses:my_policy_loss"``, see
:mod:`verlog.registry`), then name it in ``algorithm.policy_loss``.
"""

from __future__ import annotations

from typing import Any, Callable

from verlog.registry import Registry

__all__ = ["POLICY_LOSSES", "PolicyLoss", "policy_loss_fn", "policy_loss_names", "register_policy_loss"]

#: a policy loss: ``(logp, old_logp, advantages, mask, **settings) -> (loss, metrics)`` as
#: :func:`verlog.algo.losses.ppo_policy_loss`
PolicyLoss = Callable[..., "tuple[Any, dict[str, float]]"]


def _check_loss(name: str, loss: object) -> None:
    if not callable(loss):
        raise TypeError(f"the policy loss {name!r} must be a function (got {type(loss).__name__})")


def _builtin_losses(registry: Registry[PolicyLoss]) -> None:
    registry.register_lazy("ppo", "verlog.algo.losses:ppo_policy_loss", source="verlog")
    registry.register_lazy("gspo", "verlog.algo.losses:gspo_policy_loss", source="verlog")


#: every policy loss by name: verlog's, then entry points, then ``register_policy_loss``
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", check=_check_loss, builtins=_builtin_losses)


def policy_loss_names() -> tuple[str, ...]:
    """The registered policy losses' names (imports none of them: no torch)."""
    return POLICY_LOSSES.names()


def policy_loss_fn(name: str) -> PolicyLoss:
    """The policy loss named ``name``; a ``ValueError`` naming the allowed ones otherwise."""
    return POLICY_LOSSES.get(name)


def register_policy_loss(name: str, loss: PolicyLoss, *, replace: bool = False) -> PolicyLoss:
    """Add ``loss`` as ``name`` (``replace=True`` to redeclare one); returns it."""
    return POLICY_LOSSES.register(name, loss, replace=replace)
