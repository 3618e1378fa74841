"""Optuna samplers by name, adapted to the ask-and-tell loop tuner runs.

``tpe`` (default; multivariate, with constant liar so that several workers sharing a study do not all
sample the same point), ``random``, ``grid`` (every point of the space once; the driver stops when it is
exhausted) and ``cmaes`` (numeric parameters by CMA-ES, categorical ones by the independent sampler).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.samplers import GridSampler

from tuner.driver.sampler_names import SAMPLERS, SamplerName
from tuner.errors import UserInputError
from tuner.space import SearchSpace

__all__ = ["SAMPLERS", "AskTellGridSampler", "SamplerName", "exhausted", "finite_list", "make_sampler"]


class AskTellGridSampler(GridSampler):
    """GridSampler whose exhaustion is checked by the caller before each ``ask``.

    Optuna's GridSampler calls ``study.stop()`` after the last grid point, which is only legal inside
    ``study.optimize``; tuner drives studies with ask-and-tell, so it asks ``is_exhausted`` instead.
    """

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None


TPE_STARTUP_TRIALS = 10  # random trials before TPE models the results (warm starts count among them)


def make_sampler(
    name: str, space: SearchSpace, seed: int | None = None, *, startup: int = TPE_STARTUP_TRIALS
) -> optuna.samplers.BaseSampler:
    """The sampler called ``name`` (``startup``: TPE's random trials first); UserInputError for an unknown name."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise UserInputError(f"unknown sampler {name!r}; known: {', '.join(SAMPLERS)}")


def finite_list(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether the sampler hands out a finite list of points (grid, exhaustive): :func:`exhausted` ends it."""
    return callable(getattr(sampler, "is_exhausted", None))


def exhausted(sampler: optuna.samplers.BaseSampler, study: optuna.Study) -> bool:
    """Whether a sampler of a finite list (grid, exhaustive) has handed out every point (never true for
    the other samplers)."""
    is_exhausted = getattr(sampler, "is_exhausted", None)
    return bool(is_exhausted(study)) if callable(is_exhausted) else False
