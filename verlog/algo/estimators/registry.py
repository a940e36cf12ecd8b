"""The registry of advantage estimators: what each needs, and one call that applies it.

An estimator (``AdvantageEstimator``) maps a ``TurnBatch`` (``N`` slots x ``K`` turns, see
``verlog.algo.multiturn_gae``) plus the per-turn data it declares (``TurnData``) to advantages ``[N, K, T]``,
critic targets ``[N, K, T + 1]`` when it trains a critic, and the turns the policy loss may use.
Every module of this package but this one is an estimator named as its file and exposing
``ESTIMATOR``; another package adds one with :func:`register_estimator` or a ``verlog.estimators``
entry point (see :mod:`verlog.registry`). ``estimator_names`` lists them without importing them
(the config reads it, and must not load torch), ``get_estimator`` imports one.

``estimate_advantages`` is what a trainer calls: the estimator, then what every estimator shares
— DAPO's dynamic sampling (``drop_uniform_groups``) and, where asked, whitening over the batch
(``whiten_advantages``; ``null``: the estimator's own ``whitens`` default, as its paper does).
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Protocol

from verlog.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from verlog.algo.multiturn_gae import TurnBatch

__all__ = [
    "AdvantageEstimator",
    "AdvantageSettings",
    "Estimate",
    "EstimatorInputError",
    "TurnData",
    "TurnNeed",
    "check_estimator_settings",
    "estimate_advantages",
    "ESTIMATORS",
    "estimator_names",
    "get_estimator",
    "register_estimator",
]

#: per-turn data an estimator may need besides the ``TurnBatch``:
#: ``groups`` — the task of each turn's episode (its seed): episodes of one group are compared;
#: ``anchors`` — the environment state each turn acted in (GiGPO's anchor states);
#: ``episode_starts`` — whether each slot's first turn opens an episode (else its return is partial)
TurnNeed = Literal["groups", "anchors", "episode_starts"]


class AdvantageSettings(Protocol):
    """The settings estimators read (``verlog.config.AlgorithmConfig`` has them all)."""

    estimator: str
    gamma_step: float
    lam_step: float
    gamma_token: float
    lam_token: float
    whiten_advantages: bool | None
    group_norm: str | None
    gigpo_step_weight: float
    gigpo_gamma: float
    drop_uniform_groups: bool
    bootstrap_cuts: bool


class EstimatorInputError(ValueError):
    """A batch lacks a per-turn fact only the user's graph can give (GiGPO's anchor states): the
    user's to fix, so the command line reports it in one line, naming ``algorithm.estimator``."""


@dataclass
class TurnData:
    """Per-turn facts that are not rewards: ``groups`` ``[N, K]`` long (e.g. seeds),
    ``episode_starts`` ``[N]`` bool, ``anchors`` ``[N, K]`` long (an id per distinct anchor
    state of the batch, ``-1`` where the environment reported none)."""

    groups: Tensor | None = None
    episode_starts: Tensor | None = None
    anchors: Tensor | None = None


@dataclass
class Estimate:
    """What an estimator gives back.

    * ``advantages`` ``[N, K, T]`` (``0`` on padding and on excluded turns);
    * ``returns`` ``[N, K, T + 1]`` critic targets, or ``None`` (nothing for the critic);
    * ``included`` ``[N, K]`` bool: turns the policy loss uses (``None``: all), e.g. GRPO leaves
      out episodes still running at the batch boundary;
    * ``metrics``: floats to log.
    """

    advantages: Tensor
    returns: Tensor | None = None
    included: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One estimator: its name, what it needs, and its maths (``compute``).

    ``needs_critic``: the trainer loads a critic and fills ``TurnBatch.values`` (and bootstrap
    values) before ``compute``. ``needs``: the ``TurnData`` fields ``compute`` reads.
    ``learns``: ``False`` only for the zero-advantage control (nothing to whiten).
    ``whitens``: the output is whitened over the batch unless ``whiten_advantages`` says otherwise
    (PPO's GAE: ``True``; the group estimators keep their paper's scale: ``False``; an estimator
    whose formula normalizes over the batch, REINFORCE++, does it in ``compute``).
    """

    name: str
    summary: str
    needs_critic: bool
    needs: frozenset[TurnNeed]
    compute: Callable[["TurnBatch", TurnData, AdvantageSettings], Estimate]
    learns: bool = True
    whitens: bool = False

    @property
    def compares_groups(self) -> bool:
        """Whether episodes of one group are compared (what dynamic sampling filters on)."""
        return "groups" in self.needs


def _check_estimator(name: str, estimator: object) -> None:
    if not isinstance(estimator, AdvantageEstimator) or estimator.name != name:
        raise TypeError(
            f"the advantage estimator {name!r} must be an AdvantageEstimator(name={name!r}, ...) "
            f"(got {type(estimator).__name__})"
        )


def _builtin_estimators(registry: Registry[AdvantageEstimator]) -> None:
    """This package's modules, each one estimator named as its file (imported on first use)."""
    here = Path(__file__).parent
    for name in sorted(m.name for m in pkgutil.iter_modules([str(here)])):
        if name != "registry" and not name.startswith("_"):
            registry.register_lazy(name, f"{__package__}.{name}:ESTIMATOR", source="verlog")


#: every advantage estimator by name: this package's, then entry points, then ``register_estimator``
ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", check=_check_estimator, builtins=_builtin_estimators
)


def estimator_names() -> tuple[str, ...]:
    """The registered estimators' names (imports none of them)."""
    return ESTIMATORS.names()


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; ``ValueError`` naming the allowed ones otherwise."""
    return ESTIMATORS.get(name)


def register_estimator(estimator: AdvantageEstimator, *, replace: bool = False) -> AdvantageEstimator:
    """Add ``estimator`` under its ``name`` (``replace=True`` to redeclare one); returns it.
    A config then names it as ``algorithm.estimator``."""
    return ESTIMATORS.register(estimator.name, estimator, replace=replace)


def check_estimator_settings(settings: AdvantageSettings) -> None:
    """Refuse settings that do not combine, naming the keys (``ValueError``)."""
    estimator = get_estimator(settings.estimator)
    if settings.drop_uniform_groups and not estimator.compares_groups:
        groups = ", ".join(n for n in estimator_names() if get_estimator(n).compares_groups)
        raise ValueError(
            f"algorithm.drop_uniform_groups: dynamic sampling drops groups of episodes with equal returns; "
            f"estimator {settings.estimator!r} has no groups (use one of: {groups})"
        )


def estimate_advantages(settings: AdvantageSettings, batch: "TurnBatch", data: TurnData) -> Estimate:
    """Advantages of ``batch`` with ``settings.estimator``, then dynamic sampling and whitening.

    * ``drop_uniform_groups`` (DAPO's dynamic sampling): groups whose complete episodes all have
      the same return carry no learning signal; their turns leave the policy loss (so they do not
      dilute its token mean). Fixed-turn batches cannot resample them: the fraction dropped is
      reported (``dropped_group_frac``, ``dropped_turn_frac``).
    * ``whiten_advantages`` (``null``: ``estimator.whitens``): ``(A - mean) / std`` over the tokens
      the policy loss uses.

    Metrics: the estimator's own, plus ``policy_token_frac`` (share of response tokens the policy
    loss uses) when some turns are left out: ``0`` when the batch holds no complete episode (no
    whole group), so that nothing trains the policy, for every estimator alike.
    """
    import torch  # here, not at the top: the config imports this module without torch

    from verlog.algo.advantages import episodes_of, tied_groups, whiten

    estimator = get_estimator(settings.estimator)
    check_estimator_settings(settings)
    _check_inputs(estimator, batch, data)
    out = estimator.compute(batch, data, settings)

    if settings.drop_uniform_groups:
        ep = episodes_of(batch, data.groups, data.episode_starts)
        uniform = tied_groups(ep.returns, ep.complete, ep.group, ep.n_groups, tolerance=1e-6)
        scored = torch.zeros(ep.n_groups, dtype=torch.bool, device=uniform.device)
        scored[ep.group[ep.complete]] = True
        dropped = ep.per_turn(uniform[ep.group] & ep.complete)  # [N, K]
        included = ~dropped if out.included is None else out.included & ~dropped
        out.advantages = torch.where(included.unsqueeze(-1), out.advantages, torch.zeros_like(out.advantages))
        out.included = included
        out.metrics["dropped_group_frac"] = (uniform.sum() / scored.sum().clamp(min=1)).item()
        out.metrics["dropped_turn_frac"] = dropped.float().mean().item()

    policy_mask = batch.response_mask if out.included is None else batch.response_mask & out.included.unsqueeze(-1)
    whitens = estimator.whitens if settings.whiten_advantages is None else settings.whiten_advantages
    if whitens and estimator.learns:
        out.advantages = whiten(out.advantages, policy_mask)
    if out.included is not None:
        out.metrics["policy_token_frac"] = (policy_mask.sum() / batch.response_mask.sum().clamp(min=1)).item()
    return out


def _check_inputs(estimator: AdvantageEstimator, batch: "TurnBatch", data: TurnData) -> None:
    if estimator.needs_critic and batch.values is None:
        raise ValueError(f"estimator {estimator.name!r} needs the critic's values (TurnBatch.values)")
    fields = {"groups": data.groups, "anchors": data.anchors, "episode_starts": data.episode_starts}
    missing = [need for need in sorted(estimator.needs) if fields[need] is None]
    if missing:
        raise ValueError(f"estimator {estimator.name!r} needs per-turn {', '.join(missing)} (TurnData)")
