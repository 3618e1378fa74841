"""The replay device: every measurement answered from a recorded store, with no kernel and no subprocess.

A :class:`Record` holds what a store recorded for one template: per shape, the outcome of every config
measured in a sweep trial (status, reason, errors, timer, and the sample distribution: min, p20, median, p80,
max of its N samples), and the comparators' outcomes from the latest final round. A :class:`ReplayMeasurer`
answers the driver's measurement calls from it, so that the whole driver (samplers, warm starts, pruning,
the final round, publication) runs on the CPU in seconds: ``tuner tune T -w W --device replay --record URL``,
or ``benchmarks/search.py`` over exhaustive records.

Noise: the store keeps each measurement's quantiles, not its raw samples. A replayed measurement of
``n_samples`` draws that many samples from the recorded distribution (the piecewise-linear quantile function
through min, p20, median, p80 and max) and summarises them as a real measurement does, so that a
re-measured finalist comes out a little different each time, as spread as it was on the device. Draws are
deterministic given the measurement's seed, the shape and the config.

Configs (and comparators) the record does not hold come back as ``INVALID`` with the reason
``not recorded: …`` (the convention of comparators unavailable on a host: the candidate did not run), so
that a sweep over a wider space than the record goes on and says what was missing.
"""

from __future__ import annotations

import bisect
import json
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tuner.errors import DeviceError
from tuner.frozen import Config, Shape
from tuner.measure.devices.base import Fingerprint
from tuner.measure.protocol import Candidate, MeasureOptions, NearBoundChecks
from tuner.results import NOT_RECORDED, MeasureResult, SampleSummary, Status, Timer, is_space_rejection
from tuner.store import MeasurementRecord, TuningStore

COMPARATOR_PREFIX = "comparator:"
# Where the recorded quantiles sit on the quantile function's axis.
_KNOTS = (0.0, 0.2, 0.5, 0.8, 1.0)


@dataclass(frozen=True)
class Recorded:
    """One recorded outcome of a candidate. Immutable.

    ``quantiles`` (µs): min, p20, median, p80, max of the recorded samples (OK outcomes only, else None).
    """

    status: Status
    reason: str | None = None
    errors: Mapping[str, float] = field(default_factory=dict)
    timer: Timer | None = None
    quantiles: tuple[float, float, float, float, float] | None = None
    kernels: Mapping[str, float] = field(default_factory=dict)

    @property
    def median_us(self) -> float | None:
        return self.quantiles[2] if self.quantiles else None

    @classmethod
    def of(cls, row: MeasurementRecord) -> Recorded:
        quantiles = None
        if row.status is Status.OK and row.median_us is not None:
            median = row.median_us

            def known(value: float | None) -> float:
                return median if value is None else value

            p20, p80 = known(row.p20_us), known(row.p80_us)
            quantiles = (min(known(row.min_us), p20), p20, median, p80, max(known(row.max_us), p80))
        return cls(row.status, row.reason, row.errors, Timer(row.timer) if row.timer else None, quantiles,
                   row.kernels)

    def draw(self, rng: random.Random, n: int) -> list[float]:
        """``n`` samples from the recorded distribution (OK outcomes only)."""
        assert self.quantiles is not None
        q = self.quantiles
        samples = []
        for _ in range(n):
            u = rng.random()
            i = min(bisect.bisect_right(_KNOTS, u) - 1, len(_KNOTS) - 2)
            t = (u - _KNOTS[i]) / (_KNOTS[i + 1] - _KNOTS[i])
            samples.append(q[i] + (q[i + 1] - q[i]) * t)
        return samples

    def replay(self, config: Config, rng: random.Random, n_samples: int) -> MeasureResult:
        """This outcome as a fresh MeasureResult for ``config`` (OK: ``n_samples`` drawn samples)."""
        if self.status is not Status.OK or self.quantiles is None:
            return MeasureResult(self.status, config, errors=self.errors, reason=self.reason, timer=self.timer)
        summary = SampleSummary.of(self.draw(rng, n_samples))
        return MeasureResult(Status.OK, config, summary, self.errors, None, self.timer, kernels=self.kernels)


@dataclass(frozen=True)
class Record:
    """What a store recorded for one template on one device fingerprint. Immutable and thread-safe.

    ``configs``: shape -> config -> the outcome of its first sweep-trial measurement; ``comparators``:
    shape -> comparator name -> its outcome in the shape's latest final round; ``source``: where it came from.
    """

    template: str
    version: str
    fingerprint: Fingerprint
    source: str
    configs: Mapping[Shape, Mapping[Config, Recorded]]
    comparators: Mapping[Shape, Mapping[str, Recorded]]

    @classmethod
    def load(
        cls, store: TuningStore, template: str, *, version: str | None = None, fingerprint_hash: str | None = None,
    ) -> Record:
        """The record of ``template`` in ``store``: its newest template version (or ``version``), and the
        device fingerprint with the most trial measurements (or ``fingerprint_hash``). Reads only.
        Raises DeviceError when the store holds no study of that selection, StoreError when it cannot be read."""
        studies = store.list_studies(template=template)
        if version is None and studies:
            version = max((s.template_version for s in studies), key=_version_key)
        studies = [s for s in studies if s.template_version == version]
        trials = {s.id: store.list_measurements(study_id=s.id, role="trial") for s in studies}
        if fingerprint_hash is None and studies:
            counts: dict[str, int] = {}
            for s in studies:
                counts[s.fingerprint_hash] = counts.get(s.fingerprint_hash, 0) + len(trials[s.id])
            fingerprint_hash = max(counts, key=lambda h: counts[h])
        studies = [s for s in studies if s.fingerprint_hash == fingerprint_hash]
        if not studies:
            which = template + (f"@{version}" if version else "")
            raise DeviceError(f"the record {store.url} holds no study of {which}"
                              + (f" on {fingerprint_hash}" if fingerprint_hash else ""))
        configs: dict[Shape, dict[Config, Recorded]] = {}
        comparators: dict[Shape, dict[str, Recorded]] = {}
        for s in studies:
            shape = Shape(json.loads(s.shape_json))
            outcomes: dict[Config, Recorded] = {}
            # Per config its first trial row, a measurement before a rejection by the space (a config rejected
            # under an earlier, stricter space and measured since is recorded by its measurement).
            for row in sorted(trials[s.id], key=lambda r: (is_space_rejection(r.status, r.reason), r.id)):
                outcomes.setdefault(Config.from_json(row.config_json), Recorded.of(row))
            configs[shape] = outcomes
            comparators[shape] = {
                row.candidate.removeprefix(COMPARATOR_PREFIX): Recorded.of(row)
                for row in store.latest_round(study_id=s.id) if row.candidate.startswith(COMPARATOR_PREFIX)
            }
        return cls(template, str(version), Fingerprint.from_json(studies[0].fingerprint_json), store.url, configs,
                   comparators)

    def outcome(self, shape: Shape, config: Config) -> Recorded | None:
        return self.configs.get(shape, {}).get(config)

    def best(self, shape: Shape) -> tuple[Config, float] | None:
        """The fastest recorded OK config of ``shape`` and its recorded median (µs); None without one."""
        ok = [(c, r.median_us) for c, r in self.configs.get(shape, {}).items() if r.median_us is not None]
        return min(ok, key=lambda item: item[1]) if ok else None


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


class ReplayMeasurer:
    """Answers measurement calls from a :class:`Record` (the driver's measuring contract, like
    :class:`tuner.measure.measurer.Measurer`). No process, no device; thread-safe (no shared mutable state).

    Its fingerprint is the record's, with ``replay`` added to the libraries: replayed studies get keys of
    their own and never mix with the device's real studies in a store.
    """

    def __init__(self, record: Record, options: MeasureOptions | None = None) -> None:
        self.record = record
        self.options = options or MeasureOptions()

    def __enter__(self) -> ReplayMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        return None

    def set_options(self, options: MeasureOptions) -> None:
        self.options = options

    def fingerprint(self) -> Fingerprint:
        fp = self.record.fingerprint
        origin = f"{self.record.template}@{self.record.version} on {fp.hash()}"
        return replace(fp, libraries={**fp.libraries, "replay": origin},
                       info={**fp.info, "replay_of": self.record.source})

    def measure(
        self, template_ref: str, shape: Shape, candidate: Candidate, *, seed: int | None = None,
        near_bound: NearBoundChecks | None = None,
    ) -> MeasureResult:
        return self.measure_interleaved(template_ref, shape, [candidate], seed=seed, near_bound=near_bound)[0]

    def last_call_times(self) -> None:
        """None: a replay measures nothing, its calls' time is the record's lookup."""
        return None

    def measure_interleaved(
        self, template_ref: str, shape: Shape, candidates: Sequence[Candidate], *, seed: int | None = None,
        check_seeds: int | None = None, near_bound: NearBoundChecks | None = None,
    ) -> list[MeasureResult]:
        """One result per candidate, in order: the recorded outcome, its samples drawn afresh
        (seeded by ``seed``, the shape and the candidate); ``INVALID`` with ``not recorded: …`` for a
        candidate the record lacks. ``template_ref`` is not imported (the record names the template);
        ``check_seeds`` and ``near_bound`` change nothing (the record holds one verdict per config): a record
        made before trials asked ``TRIAL_NEAR_BOUND``'s headroom (2026-12-04) replays a near-bound config as
        OK where a live trial now finds it WRONG_RESULT."""
        del check_seeds, near_bound
        chosen = self.options.seed if seed is None else seed
        results = []
        for candidate in candidates:
            config = candidate.result_config()
            if candidate.comparator is not None:
                outcome = self.record.comparators.get(shape, {}).get(candidate.comparator)
            else:
                outcome = self.record.outcome(shape, config)
            if outcome is None:
                what = "the shape" if shape not in self.record.configs else candidate.label
                results.append(MeasureResult(Status.INVALID, config, reason=(
                    f"{NOT_RECORDED}: {what} of {shape.key()} is not in the record {self.record.source}")))
                continue
            rng = random.Random(zlib.crc32(f"{chosen}|{shape.key()}|{config.to_json()}".encode()))
            results.append(outcome.replay(config, rng, self.options.n_samples))
        return results
