"""Exhaustive sweeps: every valid config of a (sub)space for one shape, each measured once.

An exhaustive sweep is an ordinary study of the key (same Optuna study, same store rows, same final round and
publication as ``tuner tune``) driven by :class:`ExhaustiveSampler`, which hands out the configs of an
:class:`ExhaustivePlan` one by one and skips every config the study already holds. Running the sweep again
continues it: configs with a stored trial measurement (any status) are never measured again, and a config
whose measurement was interrupted is queued again by the trial loop. The records are what
:mod:`tuner.measure.devices.replay` answers from and what ``benchmarks/search.py`` replays samplers over.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.driver import optuna_access
from tuner.errors import ConfigError, UserInputError
from tuner.frozen import Config, Shape
from tuner.results import is_space_rejection
from tuner.space import SearchSpace
from tuner.store import TuningStore

# The plan's order: the valid configs shuffled by a fixed seed, so that a sweep stopped part-way has measured
# a uniform sample of the (sub)space rather than one corner of it.
ORDER_SEED = 0


@dataclass(frozen=True)
class ExhaustivePlan:
    """The configs an exhaustive sweep of one shape measures. Immutable.

    ``points``: the (sub)space's size before constraints; ``configs``: the valid ones, in sweep order;
    ``only``: the parameters restricted to a subset of their values (empty: the whole space).
    """

    shape: Shape
    points: int
    configs: tuple[Config, ...]
    only: Mapping[str, tuple[object, ...]]

    @classmethod
    def of(
        cls, space: SearchSpace, shape: Shape, only: Mapping[str, Sequence[object]] | None = None
    ) -> ExhaustivePlan:
        """The plan of ``space`` for ``shape``; ConfigError when ``only`` names an unknown parameter or value."""
        domains = space.restrict(only or {})
        points = 1
        for values in domains.values():
            points *= len(values)
        configs = list(space.valid_configs(shape, only))
        random.Random(ORDER_SEED).shuffle(configs)
        return cls(shape, points, tuple(configs), {k: tuple(v) for k, v in (only or {}).items()})

    def describe(self) -> str:
        within = ", ".join(f"{k}∈{{{','.join(map(_text, v))}}}" for k, v in self.only.items())
        counts = f"{len(self.configs)} valid configs of {self.points} points"
        return f"{counts} (subspace {within})" if within else counts


def parse_only(texts: Sequence[str], space: SearchSpace) -> dict[str, tuple[object, ...]]:
    """``--only`` options (``NAME=V1,V2``, repeatable) as parameter values of ``space``, typed as its
    domain's values. Raises UserInputError for bad syntax, an unknown parameter or a value outside its domain."""
    only: dict[str, tuple[object, ...]] = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        name = name.strip()
        if not sep or not name or not raw.strip():
            raise UserInputError(f"--only {text!r}: expected NAME=VALUE[,VALUE...]")
        if name in only:
            raise UserInputError(f"--only names {name} twice")
        try:
            param = space.param(name)
        except KeyError:
            raise UserInputError(f"--only: unknown parameter {name!r}; known: {', '.join(space.names)}") from None
        by_text = {_text(c): c for c in param.choices}
        values = []
        for item in raw.split(","):
            item = item.strip()
            if item not in by_text:
                raise UserInputError(f"--only {name}: {item!r} is not one of {', '.join(by_text)}")
            values.append(by_text[item])
        only[name] = tuple(values)
    try:
        space.restrict(only)
    except ConfigError as exc:
        raise UserInputError(f"--only: {exc}") from None
    return only


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def measured_configs(store: TuningStore, study_id: int) -> set[Config]:
    """The configs with a stored trial outcome in the study (any status, all workers and runs), rejections by
    the space left out (:func:`~tuner.results.is_space_rejection`): a config of the plan rejected under an
    earlier, stricter version of the space's constraints is still to measure."""
    return {Config.from_json(r.config_json) for r in store.list_measurements(study_id=study_id, role="trial")
            if not is_space_rejection(r.status, r.reason)}


class ExhaustiveSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that hands out each config of a fixed list once, in order.

    Before each trial it takes the next config that the study does not hold yet (measured, queued or handed
    out by this sampler); a trial that pops a queued config (``fixed_params``) keeps it. :meth:`is_exhausted`
    is true once every config has been handed out and nothing is queued: the trial loop stops there.
    Suggestions still go through the search space's full distributions, so the study stays compatible with
    its other trials (TPE runs of the same key). Not thread-safe; one study per sampler.
    """

    def __init__(self, configs: Iterable[Config], held: Iterable[Config] = ()) -> None:
        self._configs = tuple(configs)
        self._held: set[Config] = set(held)
        self._cursor = 0
        self._assigned: dict[int, Config] = {}  # trial number -> its config, until the trial ends
        self._fallback = optuna.samplers.RandomSampler(seed=ORDER_SEED)

    def hold(self, configs: Iterable[Config]) -> None:
        """Mark configs as held by the study already (measured or queued): they are not handed out."""
        self._held.update(configs)

    def remaining(self) -> int:
        """Configs of the list not held by the study yet."""
        return sum(1 for c in self._configs[self._cursor:] if c not in self._held)

    def is_exhausted(self, study: optuna.Study) -> bool:
        self._advance()
        if self._cursor < len(self._configs):
            return False
        return not optuna_access.waiting_trials(study)

    def _advance(self) -> None:
        while self._cursor < len(self._configs) and self._configs[self._cursor] in self._held:
            self._cursor += 1

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if optuna_access.has_fixed_params(trial):
            self._held.add(Config(optuna_access.queued_params(trial)))
            return
        self._advance()
        if self._cursor < len(self._configs):
            config = self._configs[self._cursor]
            self._held.add(config)
            self._assigned[trial.number] = config

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        config = self._assigned.get(trial.number)
        if config is None or param_name not in config:  # asked past the end: the caller checks is_exhausted
            return self._fallback.sample_independent(study, trial, param_name, param_distribution)
        return config[param_name]

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._assigned.pop(trial.number, None)
