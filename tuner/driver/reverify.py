"""``tuner verify``: a published best re-measured in fresh processes, beside the comparators, against the store.

A served number must be one a user gets. :func:`verify_best` finds, among the bests published for
(template, shape) at the current template version on the host's device kind, the one the lookup prefers for
the re-measuring host — of its device name first, then of its software as the lookup compares it, then the
most recent — and re-measures it together with the
template's comparators in ``processes`` fresh measurement processes (a new :class:`~tuner.measure.Measurer`,
hence a new worker process, each: nothing warm carries over but the compile caches on disk). Each process
measures every candidate interleaved (the measurement contract: same flush, same samples) on its own fresh
inputs, and a candidate near its error bounds there on more input sets, as in a final round, against the
bounds themselves (:data:`tuner.driver.study.VERIFY_NEAR_BOUND`: a final round asks more headroom of what it
publishes). Per process and candidate it keeps the median and the p20–p80
spread and the ratio to the figure the store holds for that candidate (the best's published median; a
comparator's figure in the final round that published the best).

The verdict is on the best config: the median over processes of its per-process medians against its stored
median. A drift beyond ``tolerance`` (±3% by default), no process measuring it OK, or a wrong result in any
process flags the verification. Every verification is recorded with the best's study (figures, the
fingerprint it ran under), so that the API, the report and the pages can show it. A drift leaves the
published best as it is (a re-tune decides). A wrong result on the study's own device name does not: the
fresh inputs disproved the config (as a final round's WRONG_RESULT does: later rounds leave it out), so the
fastest other config of the round that published it, verified on that round's inputs and not disproved, is
published in its place, or, when the round has none, the best is withdrawn and the shape is served as an
untuned one — in the one transaction that records the verification
(:meth:`tuner.store.TuningStore.record_disproval`), so that no failure in between leaves the disproved config
served. On another device name (a host verifying a foreign best) a wrong result is only flagged.
:func:`verify_served` (``tuner verify``) goes on to verify each stand-in so published, up to a limit, so that
what it leaves served has been re-measured too.

Raises UserInputError when no best is published for the shape, DeviceError / MeasureSetupError from the
measurer, StoreError from the store. Not thread-safe (one device, one verification at a time).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tuner import registry
from tuner.driver.study import COMPARATOR_PREFIX, VERIFY_NEAR_BOUND, process_label
from tuner.errors import UserInputError
from tuner.frozen import Config, Shape
from tuner.keys import software_of
from tuner.lookup import Requester, choose, requester_software
from tuner.measure.devices.base import DeviceSpec, Fingerprint
from tuner.measure.measurer import Candidate, MeasureOptions, Measurer, NearBoundChecks
from tuner.results import MeasureResult, Status
from tuner.store import BestRecord, Disproval, TuningStore, VerificationRecord
from tuner.store.entries import disproved_in, published_entries, round_winner
from tuner.store.records import VERIFIED_LABEL

DRIFT_TOLERANCE = 0.03
BEST_LABEL = VERIFIED_LABEL

MeasurerFactory = Callable[[DeviceSpec, MeasureOptions], Measurer]


@dataclass(frozen=True)
class CandidateFigures:
    """One candidate in one process: its status and figures, and the figure the store holds for it."""

    label: str  # "best" or "comparator:<name>"
    status: str
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    stored_us: float | None
    reason: str | None = None
    # device activity name -> median µs per sample in this process (OK results): which kernel moved, when the
    # total drifts from the stored figure (the stored measurement keeps the same split in its kernels_json)
    kernels: Mapping[str, float] = field(default_factory=dict, hash=False)

    @property
    def ratio(self) -> float | None:
        """This process's median over the stored figure (1.0: as stored)."""
        if self.median_us is None or not self.stored_us:
            return None
        return self.median_us / self.stored_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "status": self.status, "median_us": self.median_us,
                               "p20_us": self.p20_us, "p80_us": self.p80_us, "stored_us": self.stored_us,
                               "reason": self.reason}
        if self.kernels:
            out["kernels"] = dict(self.kernels)
        return out

    @classmethod
    def of(cls, label: str, result: MeasureResult, stored_us: float | None) -> CandidateFigures:
        s = result.summary
        reason = (result.reason or "").splitlines()[0][:200] if result.reason else None
        return cls(label, result.status.value, result.median_us, s.p20_us if s else None, s.p80_us if s else None,
                   stored_us, reason, dict(result.kernels))


@dataclass(frozen=True)
class ProcessFigures:
    """Every candidate of one fresh process (1-based ``process``)."""

    process: int
    candidates: tuple[CandidateFigures, ...]

    @property
    def best(self) -> CandidateFigures:
        return next(c for c in self.candidates if c.label == BEST_LABEL)

    def to_dict(self) -> dict[str, Any]:
        return {"process": self.process, "candidates": [c.to_dict() for c in self.candidates]}


@dataclass(frozen=True)
class Verdict:
    """The best config's figures over the processes against its stored median."""

    stored_us: float
    median_us: float | None  # median of the per-process medians (OK processes)
    low_us: float | None
    high_us: float | None
    drift: float | None  # median_us / stored_us - 1
    tolerance: float
    wrong: int = 0  # processes in which the best config failed its correctness check (WRONG_RESULT)

    @property
    def flagged(self) -> bool:
        """Drift beyond the tolerance, no process measured the best config OK, or a wrong result."""
        return self.wrong > 0 or self.drift is None or abs(self.drift) > self.tolerance

    @classmethod
    def of(cls, stored_us: float, processes: Sequence[ProcessFigures], tolerance: float) -> Verdict:
        wrong = sum(p.best.status == Status.WRONG_RESULT.value for p in processes)
        medians = [p.best.median_us for p in processes if p.best.status == "OK" and p.best.median_us is not None]
        if not medians:
            return cls(stored_us, None, None, None, None, tolerance, wrong)
        median = statistics.median(medians)
        return cls(stored_us, median, min(medians), max(medians), median / stored_us - 1.0, tolerance, wrong)


@dataclass(frozen=True)
class Verification:
    """A finished verification: what was re-measured, the figures, the verdict and the stored record."""

    template: str
    shape: Shape
    best: BestRecord
    fingerprint: Fingerprint
    processes: tuple[ProcessFigures, ...]
    verdict: Verdict
    record: VerificationRecord
    # after a wrong result: the best published in the disproved one's place (None: withdrawn, or no change)
    replacement: BestRecord | None = None
    withdrawn: bool = False  # a wrong result and no stand-in: the study's best was withdrawn

    @property
    def disproved(self) -> bool:
        """:func:`disproves`: the verification disproved the best config."""
        return disproves(self.verdict, self.fingerprint, self.best)


def disproves(verdict: Verdict, fingerprint: Fingerprint, best: BestRecord) -> bool:
    """A wrong result on the study's own device name disproves the config; on another device name it is only
    flagged (another GPU's numerics say nothing about the study's clients). Pure."""
    return verdict.wrong > 0 and fingerprint.device_name == best.device_name


def verify_best(
    store: TuningStore,
    template_name: str,
    shape: Shape,
    *,
    device: DeviceSpec | None = None,
    processes: int = 5,
    options: MeasureOptions | None = None,
    comparators: bool = True,
    comparator_processes: int | None = None,
    tolerance: float = DRIFT_TOLERANCE,
    worker: str | None = None,
    measurer_factory: MeasurerFactory = Measurer,
    on_process: Callable[[ProcessFigures], None] | None = None,
    near_bound: NearBoundChecks | None = VERIFY_NEAR_BOUND,
) -> Verification:
    """Re-measure the published best of (template, shape) in ``processes`` fresh processes and record the
    verification (see the module doc). ``comparator_processes`` (default: every process) limits the comparators
    to the first that many processes: a comparator whose compiled kernels no disk cache keeps (mamba_ssm's
    TileLang 0.1.8 MIMO backward compiles for minutes in each new process) is then built once, while the best
    config is still re-measured in every process (without ``comparators`` it is ignored). ``on_process`` sees
    each process's figures as they come.
    ``near_bound``: a candidate near its error bounds on its input set is checked on more, as in a final round
    (a config published close to its bound is the one a verification may find wrong; None: the options')."""
    if processes < 1:
        raise UserInputError(f"--processes must be at least 1, got {processes}")
    # Without comparators the limit limits nothing (a session script passes both from its environment).
    if comparators and comparator_processes is not None and not 1 <= comparator_processes <= processes:
        raise UserInputError(
            f"--comparator-processes must be between 1 and --processes ({processes}), got {comparator_processes}")
    if not tolerance > 0:
        raise UserInputError(f"the drift tolerance must be positive, got {tolerance}")
    template = registry.get(template_name)
    ref = registry.ref_of(template.name)
    spec, options = device or DeviceSpec(), options or MeasureOptions()
    labelled: list[tuple[str, Candidate]] | None = None
    stored: dict[str, float | None] = {}
    best: BestRecord | None = None
    fingerprint: Fingerprint | None = None
    figures: list[ProcessFigures] = []
    for number in range(1, processes + 1):
        with measurer_factory(spec, options) as measurer:
            if best is None:
                fingerprint = measurer.fingerprint()
                best = _published_best(store, template.name, template.version, template.backend, shape,
                                       fingerprint)
                names = [c.name for c in template.comparators()] if comparators else []
                labelled = [(BEST_LABEL, Candidate(config=Config.from_json(best.config_json)))]
                labelled += [(COMPARATOR_PREFIX + n, Candidate(comparator=n)) for n in names]
                stored = _stored_figures(store, best)
            assert labelled is not None
            these = labelled if comparator_processes is None or number <= comparator_processes else labelled[:1]
            results = measurer.measure_interleaved(ref, shape, [c for _, c in these], near_bound=near_bound)
        process = ProcessFigures(number, tuple(
            CandidateFigures.of(label, r, stored.get(label)) for (label, _), r in zip(these, results, strict=True)
        ))
        figures.append(process)
        if on_process is not None:
            on_process(process)
    assert best is not None and fingerprint is not None
    verdict = Verdict.of(best.median_us, figures, tolerance)
    fields: dict[str, Any] = dict(
        study_id=best.study_id, config_json=best.config_json, stored_us=best.median_us,
        median_us=verdict.median_us, low_us=verdict.low_us, high_us=verdict.high_us, drift=verdict.drift,
        tolerance=tolerance, flagged=verdict.flagged, processes=processes, figures=[p.to_dict() for p in figures],
        device_kind=fingerprint.kind, device_name=fingerprint.device_name, fingerprint_hash=fingerprint.hash(),
        fingerprint_json=fingerprint.to_json(), worker=worker or process_label(),
    )
    done = (_disprove(store, best, fields) if disproves(verdict, fingerprint, best)
            else Disproval(store.add_verification(**fields)))
    return Verification(template.name, shape, best, fingerprint, tuple(figures), verdict, done.verification,
                        done.replacement, done.withdrawn)


STAND_INS = 3  # stand-ins `tuner verify` verifies in turn after a disproval, by default


class ServedStep(NamedTuple):
    """One verification of :func:`verify_served`'s chain. Immutable.

    ``stand_in_next``: None when ``outcome`` published no stand-in; True when the stand-in it published is
    verified next (should the caller go on iterating); False when the limit leaves that stand-in served
    unverified (it is the chain's last step)."""

    outcome: Verification
    stand_in_next: bool | None


def verify_served(
    store: TuningStore, template_name: str, shape: Shape, *, stand_ins: int = STAND_INS, **kwargs: Any,
) -> Iterator[ServedStep]:
    """:func:`verify_best`, then, while a verification disproved the best and published a stand-in, the best
    served then in turn (the same ``kwargs``, :func:`verify_best`'s keywords; the stand-in, which keeps the study
    and the published time of the best it replaced, unless a final round published meanwhile), at most
    ``stand_ins`` times: a disproved best's stand-in is served with its round's figure only, and it may sit on
    its bounds as the disproved one did (two tf32 configs of one H200 round in a row, 2026-12-03). Yields each
    verification as it is recorded, with whether the stand-in it published (if any) is verified next
    (:class:`ServedStep`): the config served at the end was verified unless the last step says False. Raises
    (when iterated) what :func:`verify_best` raises, the verifications yielded before it staying recorded, and
    UserInputError for a negative ``stand_ins`` before any."""
    if stand_ins < 0:
        raise UserInputError(f"--stand-ins must be at least 0, got {stand_ins}")
    for number in range(stand_ins + 1):
        outcome = verify_best(store, template_name, shape, **kwargs)
        if outcome.replacement is None:
            yield ServedStep(outcome, None)
            return
        yield ServedStep(outcome, number < stand_ins)


def disproval_text(outcome: Verification) -> str:
    """What a verification that found the best wrong did, in a sentence (CLI, a verify job's task)."""
    v, best = outcome.verdict, outcome.best
    text = f"the published best gave wrong results in {v.wrong} of {len(outcome.processes)} fresh processes"
    if not outcome.disproved:
        return (f"{text} on {outcome.fingerprint.device_name}, not the device its study measured on "
                f"({best.device_name}): flagged; the best is left as it is there")
    text += " (disproved: later final rounds leave it out)"
    if outcome.replacement is not None:
        r = outcome.replacement
        return f"{text}; published in its place: {r.config_json} at {r.median_us:.2f} µs (its round's figure)"
    if outcome.withdrawn:
        return f"{text}; no other config of its round stands in: the best was withdrawn"
    return f"{text}; the study's best had changed meanwhile and was left as it is"



def verdict_text(outcome: Verification) -> str:
    """What a verification that did not disprove its best found, in a clause (a verify job's task, after the
    disprovals that led to it)."""
    v = outcome.verdict
    found = ("no process measured it OK" if v.drift is None
             else f"drift {v.drift * 100:+.1f}% ({'flagged' if v.flagged else 'within'} ±{v.tolerance * 100:g}%)")
    return f"{outcome.best.config_json} verified in turn: {found}"

DECIDE_ATTEMPTS = 3  # a final round publishing between the read and the write: decide again, this many times


@dataclass(frozen=True)
class _StandIn:
    """What a disproval does to the study's best as read: the measurement id of that best (None: none
    published), and the measurement published in its place (None: none) or whether it is withdrawn; neither
    when the best read is not disproved. Immutable."""

    best_measurement_id: int | None
    stand_in_id: int | None = None
    withdraw: bool = False


def _disprove(store: TuningStore, verified: BestRecord, fields: dict[str, Any]) -> Disproval:
    """Record the verification (``fields``, as :meth:`tuner.store.TuningStore.add_verification` takes them)
    that disproved ``verified`` on the study's device name, and act on the study's best in the same
    transaction (:meth:`tuner.store.TuningStore.record_disproval`): what :func:`_stand_in` decided on the
    best as read, unless a final round published another between the read and the write; then it is read
    and decided again, up to DECIDE_ATTEMPTS times. After that the verification is only recorded, the best
    left as it is (the final rounds that keep publishing read the disproval and leave the config out).
    Raises StoreError, and RecordConflictError from the store for a stand-in the store refuses (nothing is
    recorded then)."""
    for _ in range(DECIDE_ATTEMPTS):
        decided = _stand_in(store, verified)
        done = store.record_disproval(best_measurement_id=decided.best_measurement_id,
                                      stand_in_id=decided.stand_in_id, withdraw=decided.withdraw, **fields)
        if done is not None:
            return done
    return Disproval(store.add_verification(**fields))


def _stand_in(store: TuningStore, verified: BestRecord) -> _StandIn:
    """What a verification on the study's device name that found ``verified`` wrong (not yet recorded) does:
    when the study's best is a disproved config (by a round, a recorded verification, or this one), publish
    the fastest OK config of the final round that published it that none of them disproved
    (:func:`tuner.store.entries.round_winner`), or withdraw the best when there is none. Nothing changes when
    a final round published a config not disproved meanwhile. Reads only: :func:`_disprove` writes it,
    atomically with the verification, while the best is still the one read here."""
    wrong = disproved_in(store, verified.study_id) | {Config.from_json(verified.config_json)}
    current = store.get_study_best(study_id=verified.study_id)
    if current is None or Config.from_json(current.config_json) not in wrong:
        return _StandIn(None if current is None else current.measurement_id)
    published = store.get_measurement(measurement_id=current.measurement_id)
    rows = [] if published is None or published.round_id is None else store.list_measurements(
        study_id=current.study_id, role="final", round_id=published.round_id)
    pick = round_winner(rows, wrong)
    return _StandIn(current.measurement_id, None if pick is None else pick.id, pick is None)


def _published_best(
    store: TuningStore, template: str, version: str, backend: str, shape: Shape, fingerprint: Fingerprint
) -> BestRecord:
    """The best to verify: among the bests published for this exact shape (current version, this device
    kind), the one the lookup (:func:`tuner.lookup.choose`) prefers for this host asking as a fully informed
    client (:func:`tuner.lookup.requester_software` of its fingerprint): those of its device name first, then
    those whose compared software (driver and runtime on CUDA, torch and the template's own backend library:
    a Triton template ignores tilelang) is its, then the most recently published. ``GET /v1/best`` may serve
    a nearer shape's entry of this device name where this shape has only foreign ones; verify keeps to the
    shape's own bests."""
    mine = requester_software(fingerprint.kind, software_of(fingerprint.to_json()) or {})
    key = shape.key()
    found = [(r, e) for r, e in published_entries(store, template=template, device_kind=fingerprint.kind,
                                                   version=version) if r.shape_key == key]
    if not found:
        raise UserInputError(
            f"no best config of {template}@{version} is published for {key} on {fingerprint.kind}; "
            "run `tuner tune` first"
        )
    answer = choose(shape.to_dict(), [e for _, e in found], default=None,
                    requester=Requester(fingerprint.device_name, mine, version, backend))
    assert answer is not None and answer.entry is not None  # entries of the shape itself: distance 0
    return next(r for r, e in found if e is answer.entry)


def _stored_figures(store: TuningStore, best: BestRecord) -> dict[str, float | None]:
    """The stored figure of each candidate: the best's published median, and each comparator's median in the
    final round that published it (None where that round has none)."""
    figures: dict[str, float | None] = {BEST_LABEL: best.median_us}
    published = store.get_measurement(measurement_id=best.measurement_id)
    if published is None or published.round_id is None:
        return figures
    for m in store.list_measurements(study_id=best.study_id, role="final", round_id=published.round_id):
        if m.candidate.startswith(COMPARATOR_PREFIX):
            figures[m.candidate] = m.median_us
    return figures

