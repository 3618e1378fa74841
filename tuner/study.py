"""The study driver: one Optuna study per key, trials measured and stored, finalists re-measured, best published.

Flow of one trial (:func:`run_trials`): reserve a slot in the budget → ``ask`` → ``space.suggest`` →
``space.check`` (a violation is recorded as INVALID and the trial pruned: no compile) → a config already
measured in this study is not measured again (the trial reuses its value, ``duplicate_of``) → measure in
the isolated pool → store the measurement → ``tell`` (value = median device time; failures are FAIL with
``status`` and ``reason`` user attributes). :func:`finalize` re-measures the top-k configs, the default
config (the incumbent) and the template's comparators interleaved in one round, stores the round and
publishes the fastest verified template config as the key's best.

The driver knows Optuna, the store and the measurer; it knows nothing of HTTP. Several processes may drive
the same study at once (the job queue does): Optuna's storage shares the trials, the store shares the
measurements, and the budget decides who may run the next trial.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import optuna
from optuna.trial import TrialState
from sqlalchemy import event
from sqlalchemy.orm import Session

import db
from tuner import registry
from tuner.frozen import Config, Shape
from tuner.keys import StudyKey
from tuner.measure import Candidate, Measurer
from tuner.results import MeasureResult, SampleSummary, Status, Timer
from tuner.samplers import exhausted, make_sampler
from tuner.space import SearchSpace
from tuner.template import KernelTemplate

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

DEFAULT_LABEL = "default"
CONFIG_LABEL = "config"
COMPARATOR_PREFIX = "comparator:"


class TrialBudget(Protocol):
    """Decides whether one more measured trial may run. Implementations must be safe across processes
    when several workers share a study (the job queue reserves slots in the database)."""

    def reserve(self) -> bool:
        """Take one slot; False when the budget is spent."""

    def release(self) -> None:
        """Give back a slot taken by :meth:`reserve` that did not lead to a measurement."""

    def record(self, session: Session, *, trial_number: int, measurement_id: int, result: MeasureResult) -> None:
        """Spend the reserved slot on this measurement, in the transaction that stores it (so that a
        measurement is stored if and only if its slot is spent). May raise to roll the measurement back."""


@dataclass
class CountBudget:
    """A local budget of ``n`` measured trials (the CLI's ``--trials``)."""

    n: int
    used: int = 0

    def reserve(self) -> bool:
        if self.used >= self.n:
            return False
        self.used += 1
        return True

    def release(self) -> None:
        self.used -= 1

    def record(self, session: Session, *, trial_number: int, measurement_id: int, result: MeasureResult) -> None:
        return None


@dataclass(frozen=True)
class TrialRecord:
    """What one trial did; passed to progress callbacks and returned by :func:`run_trials`."""

    number: int
    config: Config
    status: Status
    median_us: float | None
    reason: str | None
    duplicate_of: int | None
    wall_s: float
    overhead_s: float  # wall time outside build, verification and timing (ask/tell, store, IPC)

    @property
    def measured(self) -> bool:
        return self.status is not Status.INVALID and self.duplicate_of is None


@dataclass(frozen=True)
class FinalEntry:
    label: str  # "config", "default" or "comparator:<name>"
    result: MeasureResult
    measurement_id: int


@dataclass(frozen=True)
class FinalRound:
    round_id: str
    entries: tuple[FinalEntry, ...]
    winner: FinalEntry | None  # fastest OK template config; None when nothing passed the gate
    published: bool


@dataclass
class StudyContext:
    """Everything bound to one study key in this process. Not thread-safe: one driver loop at a time."""

    template: KernelTemplate
    template_ref: str
    shape: Shape
    space: SearchSpace
    key: StudyKey
    study_id: int
    study: optuna.Study
    sampler: optuna.samplers.BaseSampler
    store: db.Store
    measurer: Measurer
    storage: optuna.storages.BaseStorage | None = None
    worker: str = field(default_factory=db.worker_id)
    seed_base: int = 0
    current_trial_id: int | None = None  # the Optuna trial being measured (for heartbeats)

    @property
    def heartbeats(self) -> bool:
        """Whether the study's trials carry heartbeats (workers sharing the study)."""
        return isinstance(self.storage, optuna.storages.RDBStorage) and bool(self.storage.get_heartbeat_interval())


def open_study(
    template_name: str,
    shape: Shape,
    *,
    store: db.Store,
    measurer: Measurer,
    sampler: str = "tpe",
    seed: int | None = None,
    heartbeat_s: float | None = None,
) -> StudyContext:
    """Create or load the study for (template, shape, the measurer's device fingerprint).

    ``heartbeat_s`` turns on Optuna's trial heartbeats (workers sharing a study): a trial whose process
    stops beating for 4 intervals is failed by the next worker and retried with the same parameters.
    Raises UnknownTemplateError, SearchSpaceError, UserInputError (sampler), StoreError, DeviceError.
    """
    template_ref = registry.ref_of(template_name)
    template = registry.load(template_ref)
    space = template.space()
    fingerprint = measurer.fingerprint()
    key = StudyKey.of(template.name, template.version, shape, fingerprint)
    with store.session() as session:
        study_row = db.get_or_create_study(
            session,
            name=key.study_name(),
            template=key.template,
            template_version=key.template_version,
            shape_key=key.shape_key,
            shape_json=shape.to_json(),
            device_kind=key.device_kind,
            device_name=key.device_name,
            fingerprint_hash=key.fingerprint_hash,
            fingerprint_json=fingerprint.to_json(),
        )
    optuna_sampler = make_sampler(sampler, space, seed)
    storage = optuna_storage(store, heartbeat_s=heartbeat_s)
    study = optuna.create_study(
        study_name=key.study_name(),
        storage=storage,
        sampler=optuna_sampler,
        direction="minimize",
        load_if_exists=True,
    )
    if not study.trials:
        study.set_user_attr("template", template.name)
        study.set_user_attr("shape", shape.key())
        study.set_user_attr("device", f"{key.device_kind}:{key.device_name}")
        for config in warm_starts(store, space, key):
            study.enqueue_trial(config.to_dict(), skip_if_exists=True)
    seed_base = zlib.crc32(key.study_name().encode()) if seed is None else seed
    return StudyContext(
        template, template_ref, shape, space, key, study_row.id, study, optuna_sampler, store, measurer,
        storage=storage, seed_base=seed_base,
    )


def warm_starts(store: db.Store, space: SearchSpace, key: StudyKey, limit: int = 4) -> list[Config]:
    """Configs a new study measures first: the default (the incumbent), the space's expert seeds, then the
    best configs published for other shapes of this template on this device (nearest shapes first), each
    once and only if valid for this shape. Invalid ones are left out rather than wasted as trials."""
    from tuner.lookup import shape_distance

    with store.session(readonly=True) as session:
        published = db.list_best(session, template=key.template, device_kind=key.device_kind,
                                 device_name=key.device_name)
    shape = key.shape.to_dict()
    others = sorted(
        (b for b in published if b.template_version == key.template_version and b.shape_key != key.shape_key),
        key=lambda b: shape_distance(shape, b.shape),
    )
    ordered = [space.default, *space.seeds, *(Config.from_json(b.config_json) for b in others[:limit])]
    chosen: list[Config] = []
    for config in ordered:
        if config not in chosen and set(config) == set(space.names) and space.is_valid(config, key.shape):
            chosen.append(config)
    return chosen


def run_trials(
    ctx: StudyContext,
    budget: TrialBudget,
    *,
    on_trial: Callable[[TrialRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_skips: int | None = None,
) -> list[TrialRecord]:
    """Run trials while the budget grants slots. Invalid and duplicate configs cost no slot; at most
    ``max_skips`` of them in a row (default 200) end the loop, as does an exhausted grid. With trial
    heartbeats on, trials of workers that stopped beating are failed (and so retried) before each trial."""
    records: list[TrialRecord] = []
    skips = 0
    limit = 200 if max_skips is None else max_skips
    while not (should_stop and should_stop()):
        if ctx.heartbeats:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(ctx.study)
        if exhausted(ctx.sampler, ctx.study) or not budget.reserve():
            break
        record = _one_trial(ctx, budget)
        records.append(record)
        if on_trial:
            on_trial(record)
        if record.measured:
            skips = 0
            continue
        budget.release()
        skips += 1
        if skips >= limit:
            log.info("stopping %s: %d invalid or duplicate configs in a row", ctx.key.study_name(), skips)
            break
    return records


def _one_trial(ctx: StudyContext, budget: TrialBudget) -> TrialRecord:
    started = time.perf_counter()
    with warnings.catch_warnings():
        # Optuna warns that heartbeats are meant for Study.optimize; tuner records them itself (worker).
        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
        trial = ctx.study.ask()
    if ctx.heartbeats:
        # Beat at once: a trial without any heartbeat is never found stale if its process dies early.
        ctx.storage.record_heartbeat(trial._trial_id)  # type: ignore[union-attr]
    config = ctx.space.suggest(trial)
    reason = ctx.space.check(config, ctx.shape)
    if reason is not None:
        result = MeasureResult(Status.INVALID, config, reason=reason)
        measurement_id = _store_result(ctx, result, role="trial", candidate=CONFIG_LABEL, trial_number=trial.number)
        _tell(ctx, trial, result, measurement_id)
        return _record(trial.number, result, None, started)
    twin = _in_flight_twin(ctx, trial.number, config)
    if twin is not None:
        # Another worker sharing the study measures this config right now: do not measure it twice.
        result = MeasureResult(Status.INVALID, config, reason=f"config in flight in trial {twin}")
        trial.set_user_attr("duplicate_of", twin)
        trial.set_user_attr("status", "DUPLICATE")
        trial.set_user_attr("reason", result.reason)
        ctx.study.tell(trial, state=TrialState.PRUNED)
        return _record(trial.number, result, twin, started)
    previous = _previous_measurement(ctx, config)
    if previous is not None:
        trial.set_user_attr("duplicate_of", previous.trial_number)
        result = _result_of(previous)
        _tell(ctx, trial, result, previous.id)
        return _record(trial.number, result, previous.trial_number, started)
    ctx.current_trial_id = trial._trial_id
    try:
        result = ctx.measurer.measure(
            ctx.template_ref, ctx.shape, Candidate(config=config), seed=ctx.seed_base + trial.number
        )
        measurement_id = _store_result(
            ctx, result, role="trial", candidate=CONFIG_LABEL, trial_number=trial.number, budget=budget
        )
    except BaseException as exc:
        # The measurement was not stored (store down, slot lost, interrupted): fail the trial so that
        # the study does not keep a RUNNING trial, and let the caller decide what to do.
        trial.set_user_attr("reason", f"not recorded: {type(exc).__name__}: {exc}"[:2000])
        ctx.study.tell(trial, state=TrialState.FAIL)
        raise
    finally:
        ctx.current_trial_id = None
    record = _record(trial.number, result, None, started)
    trial.set_user_attr("overhead_s", round(record.overhead_s, 6))
    _tell(ctx, trial, result, measurement_id)
    return record


def _record(number: int, result: MeasureResult, duplicate_of: int | None, started: float) -> TrialRecord:
    wall = time.perf_counter() - started
    phases = result.phases
    spent = phases.build_s + phases.verify_s + phases.measure_s
    return TrialRecord(
        number, result.config, result.status, result.median_us, result.reason, duplicate_of, wall,
        max(0.0, wall - spent),
    )


def _tell(ctx: StudyContext, trial: optuna.Trial, result: MeasureResult, measurement_id: int) -> None:
    trial.set_user_attr("status", result.status.value)
    trial.set_user_attr("measurement_id", measurement_id)
    if result.reason:
        trial.set_user_attr("reason", result.reason[:2000])
    if result.status is Status.INVALID:
        ctx.study.tell(trial, state=TrialState.PRUNED)
    elif result.ok and result.summary is not None:
        # Spread and phase times live in the store (measurement_id): each Optuna attribute costs a commit.
        ctx.study.tell(trial, result.summary.median_us)
    else:
        ctx.study.tell(trial, state=TrialState.FAIL)


def _store_result(
    ctx: StudyContext, result: MeasureResult, *, role: str, candidate: str,
    trial_number: int | None = None, round_id: str | None = None, budget: TrialBudget | None = None,
) -> int:
    with ctx.store.session() as session:
        row = db.add_result(
            session, study_id=ctx.study_id, role=role, candidate=candidate, result=result,
            trial_number=trial_number, round_id=round_id, worker=ctx.worker,
        )
        if budget is not None and trial_number is not None:
            budget.record(session, trial_number=trial_number, measurement_id=row.id, result=result)
    return row.id


def _in_flight_twin(ctx: StudyContext, number: int, config: Config) -> int | None:
    """The number of another RUNNING trial of the study with the same parameters, if any."""
    params = config.to_dict()
    for other in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if other.number != number and other.params == params:
            return other.number
    return None


def _previous_measurement(ctx: StudyContext, config: Config) -> db.MeasurementRecord | None:
    with ctx.store.session(readonly=True) as session:
        rows = db.list_measurements(
            session, study_id=ctx.study_id, role="trial", config_json=config.to_json(), limit=1
        )
    return rows[0] if rows else None


def _result_of(row: db.MeasurementRecord) -> MeasureResult:
    """The stored outcome of an earlier trial, as the value a duplicate trial reports."""
    summary = None
    if row.median_us is not None:
        summary = SampleSummary(
            row.median_us, row.p20_us or row.median_us, row.p80_us or row.median_us, row.mean_us or row.median_us,
            row.min_us or row.median_us, row.max_us or row.median_us, row.n_samples or 0,
        )
    return MeasureResult(
        row.status, Config.from_json(row.config_json), summary, json.loads(row.errors_json), row.reason,
        Timer(row.timer) if row.timer else None,
    )


def optuna_storage(store: db.Store, *, heartbeat_s: float | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the store's database (so that ``optuna-dashboard <url>`` shows the studies).

    On SQLite its connections get ``synchronous=NORMAL`` (safe under WAL, which the store has switched the
    file to): Optuna commits once per user attribute, and a full fsync per commit made the per-trial
    overhead several times larger than the 50 ms target. With ``heartbeat_s``, trials carry heartbeats
    and stale ones are retried (RetryFailedTrialCallback) with the same parameters.
    """
    extra: dict[str, object] = {}
    if heartbeat_s is not None:
        # Optuna 4.9 renamed the stale-trial callback argument; older releases know only the old name.
        params = inspect.signature(optuna.storages.RDBStorage).parameters
        callback = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params \
            else "failed_trial_callback"
        extra = {
            "heartbeat_interval": max(1, round(heartbeat_s)),
            "grace_period": max(4, round(4 * heartbeat_s)),
            callback: optuna.storages.RetryFailedTrialCallback(max_retry=3),
        }
    storage = optuna.storages.RDBStorage(store.optuna_url, **extra)  # type: ignore[arg-type]
    if store.dialect == "sqlite":
        event.listen(storage.engine, "connect", _sqlite_synchronous_normal)
        storage.engine.dispose()  # connections opened before the listener existed
    return storage


def _sqlite_synchronous_normal(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    try:
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def top_configs(ctx: StudyContext, k: int) -> list[Config]:
    """The k fastest distinct OK configs measured in this study's trials (all workers, all runs)."""
    with ctx.store.session() as session:
        rows = db.list_measurements(session, study_id=ctx.study_id, role="trial", status=Status.OK.value,
                                    order="median_us")
    seen: list[Config] = []
    for row in rows:
        config = Config.from_json(row.config_json)
        if config not in seen:
            seen.append(config)
        if len(seen) == k:
            break
    return seen


def finalize(
    ctx: StudyContext, *, finalists: int = 3, include_default: bool = True, comparators: bool = True,
    names: Sequence[str] | None = None,
) -> FinalRound:
    """Re-measure finalists, the default and comparators interleaved; publish the fastest verified config.

    ``names`` restricts the comparators to those names. Every entry is stored (role ``final``) under one
    ``round_id``, failures included, so that the report can show what ran in the same round.
    """
    labelled: list[tuple[str, Candidate]] = [(CONFIG_LABEL, Candidate(config=c)) for c in top_configs(ctx, finalists)]
    default = ctx.space.default
    if include_default and ctx.space.is_valid(default, ctx.shape):
        labelled = [(DEFAULT_LABEL if c.config == default else label, c) for label, c in labelled]
        if all(c.config != default for _, c in labelled):
            labelled.append((DEFAULT_LABEL, Candidate(config=default)))
    if comparators:
        for comp in ctx.template.comparators():
            if names is None or comp.name in names:
                labelled.append((COMPARATOR_PREFIX + comp.name, Candidate(comparator=comp.name)))
    round_id = uuid.uuid4().hex
    if not labelled:
        return FinalRound(round_id, (), None, False)
    results = ctx.measurer.measure_interleaved(
        ctx.template_ref, ctx.shape, [c for _, c in labelled], seed=ctx.seed_base + 1_000_003
    )
    entries = tuple(
        FinalEntry(label, result, _store_result(ctx, result, role="final", candidate=label, round_id=round_id))
        for (label, _), result in zip(labelled, results, strict=True)
    )
    winners = [e for e in entries if not e.label.startswith(COMPARATOR_PREFIX) and e.result.ok]
    winner = min(winners, key=lambda e: e.result.median_us or float("inf"), default=None)
    if winner is not None:
        with ctx.store.session() as session:
            db.publish_best(session, study_id=ctx.study_id, measurement_id=winner.measurement_id)
    return FinalRound(round_id, entries, winner, winner is not None)
