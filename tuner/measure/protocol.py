"""What a measurer and its worker processes exchange: options, candidates, requests and replies.

All classes are frozen dataclasses (immutable, picklable). Configs and shapes travel as canonical JSON, not as
:class:`~tuner.frozen.FrozenMap` objects: a pickled FrozenMap would carry a hash computed in another process
(string hashes differ between processes), so each side rebuilds its maps from JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.errors import UserInputError
from tuner.frozen import Config
from tuner.results import COMPARATOR_KEY, MeasureResult


@dataclass(frozen=True)
class NearBoundChecks:
    """More input sets for a candidate whose errors came near their bounds on the usual ones.

    A candidate that passed its ``check_seeds`` input sets with some output's worst relative error at
    ``margin`` × its bound or more (an output bounded by 0 never counts: it matched exactly) is checked on up
    to ``extra_seeds`` more sets (the seeds that follow), stopping at the first that fails it (WRONG_RESULT,
    that seed in the reason), before it is timed; ``extra_seeds`` 0 checks no more sets and asks only the
    headroom (a trial's single set: :data:`tuner.driver.study.TRIAL_NEAR_BOUND`). A candidate further from
    its bounds pays nothing. Only a gated candidate is checked again (a config; a comparator unless
    ungated): an ungated one's verdict decides nothing.

    ``headroom`` (default 1.0: the bounds themselves, which an error may reach) is the share of each output's
    bound that a config's worst error over every set it was checked on must stay under when it is below 1
    (comparators, never published, are not asked it): one that passed every set with some output at
    ``headroom`` × its bound or more is WRONG_RESULT all the same (the reason says which output and how
    near). A final round asks it of what it may publish: a config at its bound on these sets fails on
    others (:data:`tuner.driver.study.FINAL_NEAR_BOUND`). Immutable; raises UserInputError unless
    ``0 < margin <= 1``, ``0 < headroom <= 1``, ``extra_seeds >= 0``, and ``headroom < 1`` when
    ``extra_seeds`` is 0 (that would ask nothing).
    """

    margin: float
    extra_seeds: int
    headroom: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.margin <= 1:  # NaN fails too
            raise UserInputError(f"the near-bound margin must be in (0, 1], got {self.margin}")
        if self.extra_seeds < 0:
            raise UserInputError(f"extra_seeds must be >= 0, got {self.extra_seeds}")
        if not 0 < self.headroom <= 1:
            raise UserInputError(f"the headroom must be in (0, 1], got {self.headroom}")
        if self.extra_seeds == 0 and self.headroom >= 1:
            raise UserInputError("near-bound checks with no extra input set and no headroom ask nothing")

    def near(self, errors: Mapping[str, float], bounds: Mapping[str, float]) -> bool:
        """Whether some output's error is at ``margin`` × its (positive) bound or more."""
        return _first_at(errors, bounds, self.margin) is not None

    def short_of(self, errors: Mapping[str, float], bounds: Mapping[str, float]) -> tuple[str, float, float] | None:
        """The first output (in ``bounds``' order) whose error is at ``headroom`` × its positive bound or more,
        as (name, error, bound); None when every output keeps that headroom, and always with ``headroom`` 1.0
        (the check itself failed an error past its bound and passes one exactly at it)."""
        return None if self.headroom >= 1 else _first_at(errors, bounds, self.headroom)

    def why_short(self, errors: Mapping[str, float], bounds: Mapping[str, float]) -> str | None:
        """:meth:`short_of` said in words (the output, its error, the share of its bound it reached and the
        headroom asked), as WRONG_RESULT reasons give it; None when every output keeps the headroom."""
        short = self.short_of(errors, bounds)
        if short is None:
            return None
        name, error, bound = short
        return (f"output {name!r}: worst relative error {error:.3g} is {error / bound:.3f} of its bound {bound:g}; "
                f"asked: under {self.headroom:g} of it")


def _first_at(
    errors: Mapping[str, float], bounds: Mapping[str, float], share: float
) -> tuple[str, float, float] | None:
    """The first output (in ``bounds``' order) with a positive bound whose error (0 when ``errors`` lacks it) is
    at ``share`` × that bound or more, as (name, error, bound); None when there is none."""
    for name, bound in bounds.items():
        error = errors.get(name, 0.0)
        if bound > 0 and error >= share * bound:
            return name, error, bound
    return None


@dataclass(frozen=True)
class MeasureOptions:
    """How candidates are measured.

    ``n_samples`` timed samples after ``warmup`` untimed runs; ``timeout_s`` bounds the build, verification
    and timing of one candidate (``n × timeout_s`` for ``n`` candidates measured interleaved); ``seed`` is the
    default seed of the inputs; ``check_seeds`` is how many fresh input sets (seed, seed+1, …) each candidate
    is verified on; ``near_bound``, when set, checks a candidate that came near its error bounds on them on
    more sets (:class:`NearBoundChecks`; None: none; a trial asks the headroom alone, on its one set:
    :data:`tuner.driver.study.TRIAL_NEAR_BOUND`).
    """

    n_samples: int = 100
    warmup: int = 10
    timeout_s: float = 120.0
    seed: int = 0
    check_seeds: int = 1
    near_bound: NearBoundChecks | None = None

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise UserInputError(f"n_samples must be >= 1, got {self.n_samples}")
        if self.warmup < 0:
            raise UserInputError(f"warmup must be >= 0, got {self.warmup}")
        if not self.timeout_s > 0:
            raise UserInputError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.check_seeds < 1:
            raise UserInputError(f"check_seeds must be >= 1, got {self.check_seeds}")


@dataclass(frozen=True)
class Candidate:
    """What to measure: a config of the template, or one of its comparators by name (exactly one).

    A comparator's results carry the config ``{"comparator": <name>}``.
    """

    config: Config | None = None
    comparator: str | None = None

    def __post_init__(self) -> None:
        if (self.config is None) == (self.comparator is None):
            raise UserInputError("a candidate is either a config or a comparator name, exactly one of them")

    @property
    def label(self) -> str:
        if self.comparator is not None:
            return f"{COMPARATOR_KEY}:{self.comparator}"
        assert self.config is not None
        return self.config.key()

    def result_config(self) -> Config:
        """The config recorded in this candidate's MeasureResult."""
        if self.comparator is not None:
            return Config({COMPARATOR_KEY: self.comparator})
        assert self.config is not None
        return self.config


def comparator_of(config: Config) -> str | None:
    """The comparator name of a comparator's result config (:meth:`Candidate.result_config`), else None."""
    name = config.get(COMPARATOR_KEY) if len(config) == 1 else None
    return name if isinstance(name, str) else None


# -- requests (parent → worker) ---------------------------------------------------------------------
@dataclass(frozen=True)
class WireCandidate:
    """A candidate as sent: config JSON or comparator name."""

    config_json: str | None
    comparator: str | None

    @classmethod
    def of(cls, candidate: Candidate) -> WireCandidate:
        config_json = candidate.config.to_json() if candidate.config is not None else None
        return cls(config_json, candidate.comparator)

    def candidate(self) -> Candidate:
        config = Config.from_json(self.config_json) if self.config_json is not None else None
        return Candidate(config, self.comparator)


@dataclass(frozen=True)
class MeasureRequest:
    template_ref: str
    shape_json: str
    candidates: tuple[WireCandidate, ...]
    seed: int
    options: MeasureOptions


@dataclass(frozen=True)
class FingerprintRequest:
    pass


# -- replies (worker → parent) ----------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """The worker has started and opened its device backend."""

    pid: int


@dataclass(frozen=True)
class Loaded:
    """The request's template is imported; its candidates follow (their timeouts start now)."""


@dataclass(frozen=True)
class Prepared:
    """Candidate ``position`` was built and verified: ``failure`` is its result if it failed, else None."""

    position: int
    failure: MeasureResult | None


@dataclass(frozen=True)
class TimingStarted:
    """The verified candidates at these positions are now timed together."""

    positions: tuple[int, ...]


@dataclass(frozen=True)
class Done:
    """End of a measure request: results by position; ``retry`` positions were not measured because a
    candidate failed while they were timed together (one by one if ``split``: the culprit is unknown);
    ``restart`` asks the parent for a fresh worker (the device context may be corrupt)."""

    results: tuple[tuple[int, MeasureResult], ...]
    retry: tuple[int, ...] = ()
    split: bool = False
    restart: bool = False


@dataclass(frozen=True)
class FingerprintReply:
    fingerprint_json: str


@dataclass(frozen=True)
class Failed:
    """The request failed outside any candidate; ``error`` is a class name from :mod:`tuner.errors`."""

    error: str
    message: str
