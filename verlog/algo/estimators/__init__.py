"""Advantage estimators, one registry: each file of this package (but ``registry``) is one
estimator named as the file, exposing ``ESTIMATOR`` (an ``AdvantageEstimator``). Adding one is a
file plus its tests; the trainers and the config ask ``verlog.algo.estimators.registry``. An
estimator in your own package: :func:`register_estimator`, or a ``verlog.estimators`` entry point
(``my_estimator = "my_package.advantages:ESTIMATOR"``, see :mod:`verlog.registry`)."""

from verlog.algo.estimators.registry import (
    ESTIMATORS,
    AdvantageEstimator,
    AdvantageSettings,
    Estimate,
    EstimatorInputError,
    TurnData,
    TurnNeed,
    check_estimator_settings,
    estimate_advantages,
    estimator_names,
    get_estimator,
    register_estimator,
)

__all__ = [
    "ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageSettings",
    "Estimate",
    "EstimatorInputError",
    "TurnData",
    "TurnNeed",
    "check_estimator_settings",
    "estimate_advantages",
    "estimator_names",
    "get_estimator",
    "register_estimator",
]
