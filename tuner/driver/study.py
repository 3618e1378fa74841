"""The study driver: one Optuna study per key, trials measured and stored, finalists re-measured, best published.

:func:`open_study` creates or loads the study of a key (with its warm starts); the trial loop lives in
:mod:`tuner.driver.trials`; :func:`finalize` re-measures the top-k configs, the default config (the incumbent) and
the template's comparators interleaved in one round, stores the round and publishes the fastest verified
template config as the key's best.

The driver knows Optuna, the store and the measurer; it knows nothing of HTTP. Several processes may drive
the same study at once (the job queue does): Optuna's storage shares the trials, the store shares the
measurements, and the budget decides who may run the next trial.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import math
import uuid
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState
from sqlalchemy import event
from sqlalchemy.orm import Session

from tuner import db, registry
from tuner.driver.samplers import make_sampler
from tuner.frozen import Config, Shape
from tuner.keys import StudyKey
from tuner.measure.measurer import Candidate, Measurer
from tuner.results import MeasureResult, Status
from tuner.space import SearchSpace
from tuner.template import KernelTemplate

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

DEFAULT_LABEL = "default"
CONFIG_LABEL = "config"
COMPARATOR_PREFIX = "comparator:"


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
    in_flight: set[int] = field(default_factory=set)  # Optuna trial ids asked and not yet told (heartbeats)
    orphans_checked_at: float = -math.inf  # time.monotonic() of the last orphan scan (tuner.driver.trials)

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
    sampler: str | optuna.samplers.BaseSampler = "tpe",
    seed: int | None = None,
    heartbeat_s: float | None = None,
    warm: bool = True,
) -> StudyContext:
    """Create or load the study for (template, shape, the measurer's device fingerprint).

    ``sampler``: a name (:data:`tuner.samplers.SAMPLERS`) or a sampler instance (exhaustive sweeps).
    ``warm``: queue the warm starts (default, seeds, neighbouring shapes' bests) ahead of the sampler;
    an exhaustive sweep leaves them out (it measures every valid config of its plan anyway).

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
    optuna_sampler = make_sampler(sampler, space, seed) if isinstance(sampler, str) else sampler
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
    # Warm starts are queued at every opening, in their current order: a study resumed after the space gained
    # or reordered seeds, or after neighbouring shapes were tuned, measures them next (configs it already
    # has are skipped).
    if warm:
        settled = settled_params(study, heartbeats=heartbeat_s is not None, waiting=False)
        wanted = [c.to_dict() for c in warm_starts(store, space, key) if c.to_dict() not in settled]
        queue_in_order(study, storage, wanted)
    seed_base = zlib.crc32(key.study_name().encode()) if seed is None else seed
    return StudyContext(
        template, template_ref, shape, space, key, study_row.id, study, optuna_sampler, store, measurer,
        storage=storage, seed_base=seed_base,
    )


def settled_params(study: optuna.Study, *, heartbeats: bool, waiting: bool = True) -> list[dict[str, object]]:
    """Parameters of the study's trials that a warm start must not repeat: measured ones (complete,
    pruned as invalid, failed with a stored measurement) and, with ``waiting``, queued ones. A trial failed without a
    measurement (abandoned when its run was interrupted) does not count, nor, without heartbeats, a
    RUNNING one: no live process can own it then (a run killed outright leaves its trials RUNNING), so a
    seed it held is measured again rather than lost. With heartbeats a RUNNING trial may be another
    worker's; if that worker died, Optuna fails the trial and its retry callback queues it again."""
    settled = []
    for trial in study.get_trials(deepcopy=False):
        state = trial.state
        counts = (
            state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (state is TrialState.WAITING and waiting)
            or (state is TrialState.FAIL and "measurement_id" in trial.user_attrs)
            or (state is TrialState.RUNNING and heartbeats)
        )
        if counts:
            settled.append(dict(trial.system_attrs.get("fixed_params", trial.params)))
    return settled


def queue_in_order(
    study: optuna.Study, storage: optuna.storages.BaseStorage, wanted: Sequence[Mapping[str, object]]
) -> None:
    """Make ``wanted`` the head of the study's queue of WAITING trials, in this order, ahead of the other
    queued configs (kept, in their order, after it).

    Optuna pops WAITING trials oldest first, so a seed added to the space would otherwise wait behind
    everything earlier runs queued and never run in a short resumed run. When the queue is already in
    order, missing entries are appended. Otherwise the queued trials are withdrawn (failed without a
    measurement, so nothing counts them) and the whole queue is enqueued again. Withdrawing is a
    conditional update (only a trial still WAITING): a trial another worker popped meanwhile keeps
    running and is left out of the new queue; two workers reordering at once may queue a config twice,
    which the trial loop counts as a duplicate instead of measuring it again. A queued heartbeat retry
    that is withdrawn and queued again starts its retry count afresh."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    queued = [dict(t.system_attrs.get("fixed_params", t.params)) for t in waiting]
    desired = [dict(p) for p in wanted] + [q for q in queued if q not in wanted]
    if desired[: len(queued)] == queued:
        for params in desired[len(queued):]:
            study.enqueue_trial(params)
        return
    withdrawn = _withdraw_waiting(storage, [t._trial_id for t in waiting])
    taken = [q for t, q in zip(waiting, queued, strict=True) if t._trial_id not in withdrawn]
    for params in desired:
        if params not in taken:  # popped by another worker meanwhile: running
            study.enqueue_trial(params)


def _withdraw_waiting(storage: optuna.storages.BaseStorage, trial_ids: Sequence[int]) -> set[int]:
    """Fail those of ``trial_ids`` that are still WAITING, atomically per trial; returns the ids failed.
    ``storage`` is the study's (the RDB storage the store opened, or an in-memory one)."""
    if not isinstance(storage, optuna.storages.RDBStorage):  # in-memory studies have one process
        for trial_id in trial_ids:
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        return set(trial_ids)
    state = sa.Enum(TrialState, name="trialstate")  # Optuna's column: a native enum on PostgreSQL
    trials = sa.table("trials", sa.column("trial_id"), sa.column("state", state), sa.column("datetime_complete"))
    now = datetime.datetime.now()
    withdrawn: set[int] = set()
    with storage.engine.begin() as connection:
        for trial_id in trial_ids:
            result = connection.execute(
                sa.update(trials)
                .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.WAITING)
                .values(state=TrialState.FAIL, datetime_complete=now)
            )
            if result.rowcount:
                withdrawn.add(trial_id)
    return withdrawn


def warm_starts(store: db.Store, space: SearchSpace, key: StudyKey, limit: int = 4) -> list[Config]:
    """Configs a new study measures first: the default (the incumbent), the space's expert seeds, then the
    best configs published for other shapes of this template on this device (nearest shapes first), each
    once and only if valid for this shape. Invalid ones are left out rather than wasted as trials."""
    from tuner.service.lookup import shape_distance

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


def store_result(
    ctx: StudyContext, result: MeasureResult, *, role: str, candidate: str,
    trial_number: int | None = None, round_id: str | None = None,
    spend: Callable[[Session, int], None] | None = None,
) -> int:
    """Store one measurement of the study; ``spend(session, measurement_id)`` runs in the same transaction
    (the trial budget spends its slot there, so a measurement is stored if and only if its slot is spent)."""
    with ctx.store.session() as session:
        row = db.add_result(
            session, study_id=ctx.study_id, role=role, candidate=candidate, result=result,
            trial_number=trial_number, round_id=round_id, worker=ctx.worker,
        )
        if spend is not None:
            spend(session, row.id)
    return row.id


def optuna_storage(store: db.Store, *, heartbeat_s: float | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the store's database (so that ``optuna-dashboard <url>`` shows the studies).

    On SQLite its connections get ``synchronous=NORMAL`` (safe under WAL, which the store has switched the
    file to): Optuna commits once per user attribute, and a full fsync per commit made the per-trial
    overhead several times larger than the 50 ms target. With ``heartbeat_s``, trials carry heartbeats
    and stale ones are retried (Optuna's retry callback) with the same parameters.
    """
    extra: dict[str, object] = {}
    if heartbeat_s is not None:
        # Optuna 4.9 renamed the stale-trial callback (argument and class); older releases know the old names.
        params = inspect.signature(optuna.storages.RDBStorage).parameters
        callback = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params \
            else "failed_trial_callback"
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
            or optuna.storages.RetryFailedTrialCallback
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            extra = {
                "heartbeat_interval": max(1, round(heartbeat_s)),
                "grace_period": max(4, round(4 * heartbeat_s)),
                callback: retry(max_retry=3),
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
        FinalEntry(label, result, store_result(ctx, result, role="final", candidate=label, round_id=round_id))
        for (label, _), result in zip(labelled, results, strict=True)
    )
    winners = [e for e in entries if not e.label.startswith(COMPARATOR_PREFIX) and e.result.ok]
    winner = min(winners, key=lambda e: e.result.median_us or float("inf"), default=None)
    if winner is not None:
        with ctx.store.session() as session:
            db.publish_best(session, study_id=ctx.study_id, measurement_id=winner.measurement_id)
    return FinalRound(round_id, entries, winner, winner is not None)
