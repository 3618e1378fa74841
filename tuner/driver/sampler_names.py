"""The names of the samplers (:mod:`tuner.driver.samplers` builds them): importable without Optuna, for the
API's request schemas."""

from __future__ import annotations

from typing import Literal, get_args

SamplerName = Literal["tpe", "random", "grid", "cmaes"]
SAMPLERS: tuple[str, ...] = get_args(SamplerName)
