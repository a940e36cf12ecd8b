"""Advantage estimators, one registry: each file of this package (but ``registry``) is one
estimator named as the file, exposing ``ESTIMATOR`` (an ``AdvantageEstimator``). Adding one is a
file plus its tests; the trainers and the config ask ``verlog.algo.estimators.registry``."""

from verlog.algo.estimators.registry import (
    AdvantageEstimator,
    AdvantageSettings,
    Estimate,
    TurnData,
    TurnNeed,
    check_estimator_settings,
    estimate_advantages,
    estimator_names,
    get_estimator,
)

__all__ = [
    "AdvantageEstimator",
    "AdvantageSettings",
    "Estimate",
    "TurnData",
    "TurnNeed",
    "check_estimator_settings",
    "estimate_advantages",
    "estimator_names",
    "get_estimator",
]
