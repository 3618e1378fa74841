"""The study driver: one Optuna study per key, trials measured and stored, finalists re-measured, best published.

:func:`open_study` creates or loads the study of a key (with its warm starts); the trial loop lives in
:mod:`tuner.driver.trials`; :func:`finalize` re-measures the top-k configs, the default config (the incumbent) and
the template's comparators interleaved in one round, stores the round and publishes the fastest verified
template config as the key's best.

The driver knows Optuna, the store contract (:mod:`tuner.store`) and the measurer; it knows nothing of HTTP
or SQL. Several processes may drive the same study at once (the job queue does): Optuna's storage shares the
trials, the store shares the measurements, and the budget decides who may run the next trial. Optuna
internals are reached through :mod:`tuner.driver.optuna_access` only.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import registry
from tuner.distance import DEFAULT_DISTANCE
from tuner.driver import optuna_access
from tuner.driver.heartbeat import InFlight
from tuner.driver.samplers import make_sampler
from tuner.frozen import Config, Scalar, Shape
from tuner.keys import StudyKey
from tuner.lookup import Entry, fit_distance, latest_per_shape, repair_config
from tuner.measure.compile_cache import CompilePool
from tuner.measure.contract import CallTimes, Measuring
from tuner.measure.measurer import Candidate, NearBoundChecks
from tuner.results import (
    COMPARATOR_PREFIX,
    CONFIG_LABEL,
    DEFAULT_LABEL,
    MeasureResult,
    PhaseTimes,
    Status,
    is_space_rejection,
)
from tuner.space import SearchSpace
from tuner.spec import CarriedVersion
from tuner.store import BestRecord, NewMeasurement, RoundHold, TrialHeartbeats, TuningStore
from tuner.store.entries import disproved_in
from tuner.template import KernelTemplate

log = logging.getLogger(__name__)
T = TypeVar("T")
# runs a store write (or read) of work already done that must not be lost: a worker retries it through an
# outage (tuner.db.retry.durable); it must then be safe to run again after a try whose answer was lost
Persist = Callable[[Callable[[], T]], T]


def once(write: Callable[[], T]) -> T:
    """The :data:`Persist` of a caller without retries: the write, run once."""
    return write()

METRIC_NAME = "median time (µs)"  # the trial value: median device time (CPU time on the CPU backend)


@dataclass(frozen=True)
class FinalEntry:
    label: str  # "config", "default" or "comparator:<name>"
    result: MeasureResult
    measurement_id: int

    # RankedEntry (keep_served): an OK result's config and figures
    @property
    def config(self) -> Config:
        return self.result.config

    @property
    def median_us(self) -> float:
        return self.result.median_us if self.result.median_us is not None else math.inf

    @property
    def p80_us(self) -> float:
        return self.result.summary.p80_us if self.result.summary is not None else math.inf


@dataclass(frozen=True)
class FinalRound:
    round_id: str
    entries: tuple[FinalEntry, ...]
    # the published config (else the one it would have published: the config served before the round when
    # the fastest was not clearly faster, :func:`keep_served`, else the fastest OK one not disproved); None
    # when none passed the gate or every one was disproved by a verification meanwhile (``disproved``)
    winner: FinalEntry | None
    published: bool
    disproved: int = 0  # OK configs of the round left out because a verification or round found them wrong
    # wall seconds of the round's parallel prebuild in the compile pool (0 without one) and of its measuring
    # call (every candidate's build, checks and the interleaved timing, in the measuring process)
    prebuild_s: float = 0.0
    measure_s: float = 0.0
    # the measuring call's parts (process start, template, builds and checks, timing); None when unknown
    measure_times: CallTimes | None = None
    # the round's fastest publishable entry when the winner is the config served before the round instead
    # (:func:`keep_served`: the fastest was not clearly faster); None otherwise
    kept_over: FinalEntry | None = None


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
    store: TuningStore
    measurer: Measuring
    storage: optuna.storages.BaseStorage
    worker: str = field(default_factory=lambda: process_label())
    seed_base: int = 0
    device_index: int | None = None  # recorded with every measurement: which device of the host measured
    device_uuid: str | None = None
    in_flight: InFlight = field(default_factory=InFlight)  # trials asked and not yet told (heartbeats read it)
    orphans_checked_at: float = -math.inf  # time.monotonic() of the last orphan scan (tuner.driver.trials)
    # the last trial loop ended on a run of proposals that needed no measurement (known configs, invalid
    # ones): its sampler found nothing new to measure (tuner.driver.trials.run_trials)
    stalled: bool = False
    # the shape's valid configs, enumerated once when the trial loop first looks for one the study lacks
    # (tuner.driver.trials.unseen_config); enumerable: at most ENUMERABLE_VALID of them
    valid_configs: tuple[Config, ...] | None = None
    enumerable: bool = False

    @property
    def heartbeats(self) -> bool:
        """Whether the study's trials carry heartbeats (workers sharing the study)."""
        return optuna_access.heartbeats_enabled(self.storage)


def process_label() -> str:
    """``host/pid`` of this process: who stored a measurement."""
    return f"{socket.gethostname()}/{os.getpid()}"


def trial_heartbeats(heartbeat_s: float) -> TrialHeartbeats:
    """Optuna trial heartbeats every ``heartbeat_s`` (at least 1 s); a trial silent for 4 beats is stale."""
    return TrialHeartbeats(interval_s=max(1, round(heartbeat_s)), grace_s=max(4, round(4 * heartbeat_s)))


def open_study(
    template_name: str,
    shape: Shape,
    *,
    store: TuningStore,
    measurer: Measuring,
    sampler: str | optuna.samplers.BaseSampler = "tpe",
    seed: int | None = None,
    heartbeat_s: float | None = None,
    warm: bool = True,
    device_index: int | None = None,
) -> StudyContext:
    """Create or load the study for (template, shape, the measurer's device fingerprint).

    ``sampler``: a name (:data:`tuner.samplers.SAMPLERS`) or a sampler instance (exhaustive sweeps).
    ``warm``: queue the warm starts (default, seeds, neighbouring shapes' bests) ahead of the sampler;
    an exhaustive sweep leaves them out (it measures every valid config of its plan anyway).
    ``device_index``: the measuring device's index on this host, recorded with every measurement beside
    the GPU's UUID (``uuid`` in the fingerprint's info, where the backend knows it).

    ``heartbeat_s`` turns on Optuna's trial heartbeats (workers sharing a study): a trial whose process
    stops beating for 4 intervals is failed by the next worker and retried with the same parameters.
    Raises UnknownTemplateError, SearchSpaceError, UserInputError (sampler), StoreError, DeviceError.
    """
    template_ref = registry.ref_of(template_name)
    template = registry.load(template_ref)
    space = template.space()
    fingerprint = measurer.fingerprint()
    key = StudyKey.of(template.name, template.version, shape, fingerprint)
    study_row = store.get_or_create_study(
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
    storage = store.optuna_storage(heartbeats=None if heartbeat_s is None else trial_heartbeats(heartbeat_s))
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
    if study.metric_names is None:  # optuna-dashboard labels the objective with it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAME])
    # Warm starts are queued at every opening, in their current order: a study resumed after the space gained
    # or reordered seeds, or after neighbouring shapes were tuned, measures them next (configs it already
    # has are skipped).
    if warm:
        settled = settled_params(study, heartbeats=heartbeat_s is not None, waiting=False)
        wanted = [c.to_dict() for c in warm_starts(store, space, key, carries=template.spec.carries)
                  if c.to_dict() not in settled]
        queue_in_order(study, store, wanted)
    seed_base = zlib.crc32(key.study_name().encode()) if seed is None else seed
    uuid = fingerprint.info.get("uuid")
    return StudyContext(
        template, template_ref, shape, space, key, study_row.id, study, optuna_sampler, store, measurer,
        storage=storage, seed_base=seed_base, device_index=device_index,
        device_uuid=str(uuid) if uuid is not None else None,
    )


def settled_params(
    study: optuna.Study, *, heartbeats: bool, waiting: bool = True, trials: Sequence[FrozenTrial] | None = None,
) -> list[dict[str, object]]:
    """Parameters of the study's trials that a warm start must not repeat: measured ones (complete,
    pruned as a duplicate, failed with a stored measurement) and, with ``waiting``, queued ones. A trial the
    space rejected does not count (:func:`~tuner.results.is_space_rejection`): a warm start is valid for the
    shape now, so that trial was judged under an earlier, stricter version of its constraints. A trial failed
    without a measurement (abandoned when its run was interrupted) does not count, nor, without heartbeats,
    a RUNNING one: no live process can own it then (a run killed outright leaves its trials RUNNING), so a
    seed it held is measured again rather than lost. With heartbeats a RUNNING trial may be another
    worker's; if that worker died, Optuna fails the trial and its retry callback queues it again. A trial
    that stepped aside for a twin in flight (pruned, status ``DUPLICATE``) counts while that twin does: a
    twin that then failed without a measurement and was not queued again (its retries spent, or a store
    failure without heartbeats) leaves the config unsettled, so it is asked again. ``trials``: the study's
    trials when the caller has just read them (default: read here)."""
    every = list(study.get_trials(deepcopy=False) if trials is None else trials)
    by_number = {t.number: t for t in every}

    def counts(trial: FrozenTrial, via: frozenset[int] = frozenset()) -> bool:
        state = trial.state
        if state is TrialState.PRUNED and trial.user_attrs.get("status") == "DUPLICATE":
            twin = by_number.get(trial.user_attrs.get("duplicate_of"))  # type: ignore[arg-type]
            return twin is not None and twin.number not in via and counts(twin, via | {trial.number})
        return (
            state is TrialState.COMPLETE
            or (state is TrialState.PRUNED and not _rejected_by_space(trial))
            or (state is TrialState.WAITING and waiting)
            or (state is TrialState.FAIL and "measurement_id" in trial.user_attrs)
            or (state is TrialState.RUNNING and heartbeats)
        )

    return [optuna_access.queued_params(t) for t in every if counts(t)]


def _rejected_by_space(trial: optuna.trial.FrozenTrial) -> bool:
    status = trial.user_attrs.get("status")
    return status is not None and is_space_rejection(str(status), trial.user_attrs.get("reason"))


def queue_in_order(study: optuna.Study, store: TuningStore, wanted: Sequence[Mapping[str, object]]) -> None:
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
    waiting = optuna_access.waiting_trials(study)
    queued = [optuna_access.queued_params(t) for t in waiting]
    desired = [dict(p) for p in wanted] + [q for q in queued if q not in wanted]
    if desired[: len(queued)] == queued:
        for params in desired[len(queued):]:
            study.enqueue_trial(params)
        return
    withdrawn = store.withdraw_waiting_trials([optuna_access.trial_id(t) for t in waiting])
    taken = [q for t, q in zip(waiting, queued, strict=True) if optuna_access.trial_id(t) not in withdrawn]
    for params in desired:
        if params not in taken:  # popped by another worker meanwhile: running
            study.enqueue_trial(params)


def warm_starts(store: TuningStore, space: SearchSpace, key: StudyKey, limit: int = 4,
                carries: Sequence[CarriedVersion] = ()) -> list[Config]:
    """Configs a new study measures first: the default (the incumbent), this shape's best under a version the
    template carries (:class:`tuner.spec.CarriedVersion`, completed: what the lookup serves here until this
    version publishes, so that the study's first best is measured against it), the best configs published for
    other shapes of this template version on this device (nearest shapes first, each shape's latest best,
    whatever software it was tuned under: where a shape has bests under several fingerprints the lookup would
    serve this worker the one of its own software, the warm start takes the latest), then the space's expert
    seeds, each once and only if valid for this shape (:func:`order_warm_starts`)."""
    published = store.list_best(template=key.template, device_kind=key.device_kind, device_name=key.device_name)
    others = [Entry(template=b.template, template_version=b.template_version, shape=b.shape,
                    device_kind=b.device_kind, device_name=b.device_name, config=b.config,
                    published_at=b.published_at.isoformat())
              for b in published if b.template_version == key.template_version and b.shape_key != key.shape_key]
    carried = _carried_here(published, key, carries)
    return order_warm_starts(space, key.shape, others, limit, carried=[] if carried is None else [carried])


def carried_config(store: TuningStore, space: SearchSpace, key: StudyKey,
                   carries: Sequence[CarriedVersion]) -> Config | None:
    """The carried version's config the lookup serves for the study's shape on its device while the study's
    version has no best of its own there: the latest best of the first carried version with one, completed
    and repaired as the lookup repairs it; None when this version has one, or no carried version does (or its
    config fits the space nowhere). One read. Raises StoreError."""
    published = store.list_best(template=key.template, device_kind=key.device_kind, device_name=key.device_name)
    raw = _carried_here(published, key, carries)
    return None if raw is None else valid_or_repaired(space, key.shape.to_dict(), raw)


def _carried_here(published: Sequence[BestRecord], key: StudyKey,
                  carries: Sequence[CarriedVersion]) -> Mapping[str, Scalar] | None:
    """Of ``published`` (the device's bests), the completed config of the first carried version with a best
    for the key's shape, its latest; None when the key's own version has one there. Pure."""
    if any(b.template_version == key.template_version and b.shape_key == key.shape_key for b in published):
        return None
    return carried_best(published, key.shape_key, carries)


def carried_best(published: Sequence[BestRecord], shape_key: str,
                 carries: Sequence[CarriedVersion]) -> Mapping[str, Scalar] | None:
    """Of ``published`` (one device's bests), the completed config of the first carried version with a best
    for ``shape_key``, its latest; None when none has one. Whether the current version has a best there too is
    not asked (:func:`carried_config` asks it). Pure."""
    for version in carries:
        own = sorted((b for b in published if b.template_version == version.version and b.shape_key == shape_key),
                     key=lambda b: b.published_at, reverse=True)
        if own:
            return version.config(own[0].config)
    return None


def order_warm_starts(space: SearchSpace, shape: Shape, neighbours: Sequence[Entry], limit: int = 4,
                      carried: Sequence[Mapping[str, Scalar]] = ()) -> list[Config]:
    """The default, ``carried`` (this shape's configs of carried versions), the configs of the ``limit``
    nearest ``neighbours`` (other shapes' best configs, by the lookup's distance fitted over them, however far;
    ties in shape order), then the space's seeds, each once, keeping only configs of the space's domain that
    are valid for ``shape``. The neighbours come before the seeds: the nearest one's config is what the lookup
    serves this shape until it is tuned, so a study shorter than the seed list (the TileLang chunk cumsum's
    has 33) still measures it, and cannot publish a best slower than what was served without having timed
    it. A shape with several entries
    counts once, with its latest (:func:`tuner.lookup.latest_per_shape`, the examples the lookup's
    :func:`tuner.lookup.fit_distance` fits on). A neighbour's config that is invalid for ``shape`` is repaired
    as the lookup repairs it (:func:`tuner.lookup.repair_config`: the smallest valid change), else left out
    rather than wasted as a trial. Each candidate's validity is checked once. Pure."""
    here = shape.to_dict()
    examples = latest_per_shape(neighbours)
    distance = fit_distance(DEFAULT_DISTANCE, examples)
    nearest = sorted(examples, key=lambda e: distance(here, e.shape))[:limit]  # stable: ties in shape order
    chosen: list[Config] = []
    valid = [c for c in (space.default, *space.seeds) if _in_domain(space, c) and space.is_valid(c, shape)]
    mended = [c for c in (valid_or_repaired(space, here, raw) for raw in carried) if c is not None]
    head = valid[:1] if valid and valid[0] == space.default else []
    for config in [*head, *mended]:
        if config not in chosen:  # the default, the carried configs (repaired as the lookup repairs them)
            chosen.append(config)
    for entry in nearest:
        if Config(dict(entry.config)) in chosen:  # chosen configs are valid: nothing to check
            continue
        fixed = valid_or_repaired(space, here, entry.config)
        if fixed is not None and fixed not in chosen:
            chosen.append(fixed)
    chosen.extend(c for c in dict.fromkeys(valid) if c not in chosen)  # then the seeds, each once
    return chosen


def valid_or_repaired(space: SearchSpace, shape: Mapping[str, Scalar], raw: Mapping[str, Scalar]) -> Config | None:
    """``raw`` if it is a config of the space valid for ``shape``, else the lookup's repair of it
    (:func:`tuner.lookup.repair_config`: the smallest valid change), else None."""
    config = Config(dict(raw))
    if not space.is_valid(config, Shape(dict(shape))):
        fixed = repair_config(raw, shape, space.domains, space.constraint_check)
        if fixed is None:
            return None
        config = Config(fixed[0])  # valid: repair_config returns only configs that pass the check
    return config if _in_domain(space, config) else None


def _in_domain(space: SearchSpace, config: Config) -> bool:
    """Whether ``config`` sets exactly the space's parameters, each to a value of its domain."""
    return space.in_domain(config)


def new_measurement(
    result: MeasureResult, *, study_id: int, role: str, candidate: str, trial_number: int | None = None,
    round_id: str | None = None, worker: str | None = None, device_index: int | None = None,
    device_uuid: str | None = None,
) -> NewMeasurement:
    """The store's plain-value form of one measured candidate."""
    s = result.summary
    return NewMeasurement(
        study_id=study_id, role=role, candidate=candidate, config_json=result.config.to_json(),
        status=result.status, round_id=round_id, trial_number=trial_number, reason=result.reason,
        errors_json=dict(result.errors), kernels_json=dict(result.kernels),
        median_us=s.median_us if s else None, p20_us=s.p20_us if s else None, p80_us=s.p80_us if s else None,
        mean_us=s.mean_us if s else None, min_us=s.min_us if s else None, max_us=s.max_us if s else None,
        n_samples=s.n if s else None, timer=result.timer, build_s=result.phases.build_s,
        verify_s=result.phases.verify_s, measure_s=result.phases.measure_s, worker=worker,
        device_index=device_index, device_uuid=device_uuid,
    )


def store_result(
    ctx: StudyContext, result: MeasureResult, *, role: str, candidate: str,
    trial_number: int | None = None, round_id: str | None = None, slot_id: int | None = None,
) -> int:
    """Store one measurement of the study and, with ``slot_id``, spend that trial slot on it (one store
    transaction: a measurement is stored if and only if its slot is spent); returns the measurement id."""
    measurement = new_measurement(result, study_id=ctx.study_id, role=role, candidate=candidate,
                                  trial_number=trial_number, round_id=round_id, worker=ctx.worker,
                                  device_index=ctx.device_index, device_uuid=ctx.device_uuid)
    return ctx.store.record_measurement(measurement, slot_id=slot_id).id


def disproved_configs(ctx: StudyContext) -> set[Config]:
    """:func:`tuner.store.entries.disproved_in` of the context's study."""
    return disproved_in(ctx.store, ctx.study_id)


def top_configs(ctx: StudyContext, k: int, disproved: Collection[Config] | None = None) -> list[Config]:
    """The k fastest distinct OK configs measured in this study's trials (all workers, all runs), leaving out
    ``disproved`` (default: the :func:`disproved_configs`) and trials stored OK before trials asked
    :data:`TRIAL_NEAR_BOUND`'s headroom that did not keep it (their stored errors say so): the next fastest
    take their places instead of failing again."""
    disproved = disproved_configs(ctx) if disproved is None else disproved
    rows = ctx.store.list_measurements(study_id=ctx.study_id, role="trial", status=Status.OK, order="median_us")
    bounds = ctx.template.error_bounds(ctx.shape)
    seen: list[Config] = []
    for row in rows:
        if len(seen) == k:
            break
        config = Config.from_json(row.config_json)
        if config not in seen and config not in disproved and TRIAL_NEAR_BOUND.short_of(row.errors, bounds) is None:
            seen.append(config)
    return seen


def incumbent(ctx: StudyContext, disproved: Collection[Config] | None = None) -> Config | None:
    """The config the study publishes now, when it is still a valid config of the space for the shape and
    not ``disproved`` by a later round (default: the :func:`disproved_configs`)."""
    best = ctx.store.get_study_best(study_id=ctx.study_id)
    if best is None:
        return None
    config = Config(best.config)
    valid = _in_domain(ctx.space, config) and ctx.space.is_valid(config, ctx.shape)
    disproved = disproved_configs(ctx) if disproved is None else disproved
    return config if valid and config not in disproved else None


# Input sets every final-round candidate is verified on before it is timed (a trial is checked on one): a
# config at its error bound on some inputs is not published on the strength of one set (seen on the H200:
# tf32 MIMO configs passed their trials and failed 1e-3 on the round's inputs; another shape's tf32 winner
# sits at 0.91 of it). Verification costs a fraction of a second per set.
FINAL_CHECK_SEEDS = 3

# A candidate of the final round whose worst error on those sets reached half of an output's bound is checked
# on up to 8 more before it is timed, stopping at the first that fails it (tuner.measure.protocol.NearBoundChecks).
# Seen on the H200: a tf32 MIMO config passed its trial's set and the round's three close to its 1e-3 bound, was
# published, and failed `tuner verify`'s set at 1.01e-3 (twice on one shape); tf32 configs sat at 0.88–1.01 of
# the bound, the lowp3 and bf16 winners at 0.07 or less. A margin of 0.5 takes in the first kind with room to
# spare (a config under it on three sets would have to double its error on another set to fail, where the
# figures of one kind spread over 0.88–1.01) and leaves the second kind 7× below it: they pay nothing. Eight
# more sets make 11 in all: a config wrong on one input set in four passes them all with probability
# 0.75**11 ≈ 4% (0.75**3 ≈ 42% with three). Each set costs one reference and one run, a fraction of a second.
# And what it publishes keeps 3% under every bound over those sets (headroom 0.97), else it is WRONG_RESULT: on
# the H200 store (benchmarks/h200/mamba3_mimo_bwd.db, 2026-12-04) a tf32 config's worst error moved by up to
# 2.7% of the bound between input sets (0.988 of it over a round's 11 sets, 1.015 on `tuner verify`'s), and every
# final-round config that a verification later disproved (six entries, two shapes) had passed its round at 0.988
# of a bound or more; tf32 configs sat at 0.90–1.0 of their bounds, the lowp3 and bf16 ones under 0.5. None
# of the bests verified correct so far was at 0.97 or more in its round (R8's tf32 best: 0.906).
FINAL_NEAR_BOUND = NearBoundChecks(margin=0.5, extra_seeds=8, headroom=0.97)
# `tuner verify` checks a best against its bounds themselves: it answers whether the config is right on
# fresh inputs, not whether a round would publish it again.
VERIFY_NEAR_BOUND = NearBoundChecks(margin=0.5, extra_seeds=8)
# A trial asks the final round's headroom on its one input set, and no more sets: a config at 0.97 of a bound
# there would very likely be refused by the round (errors move by up to 2.7% of a bound between sets, so this is
# a little stricter than the round), so it is WRONG_RESULT as a trial too: it no longer counts as a fast config
# for the sampler (Optuna's samplers pass over failed trials) and never takes a finalist's place from one the
# round can publish (top_configs also passes over OK trials stored before this rule that lack the headroom).
# On the H200 (2026-12-04, twenty-third session) N128 P128's round spent one of its three finalists
# on a tf32 config it then refused; in the MIMO store's version-4 studies tf32 trials sat at 0.875–1.0 of a
# bound on their one set, 71 of 170 at 0.97 or more (lowp3 and bf16: under 0.5; R8's served tf32 best: 0.906).
TRIAL_NEAR_BOUND = NearBoundChecks(margin=FINAL_NEAR_BOUND.headroom, extra_seeds=0,
                                   headroom=FINAL_NEAR_BOUND.headroom)


def finalize(
    ctx: StudyContext, *, finalists: int = 3, include_default: bool = True, comparators: bool = True,
    names: Sequence[str] | None = None, check_seeds: int = FINAL_CHECK_SEEDS,
    near_bound: NearBoundChecks | None = FINAL_NEAR_BOUND, pool: CompilePool | None = None,
    may_publish: Callable[[], bool] | None = None, persist: Persist | None = None, hold: RoundHold | None = None,
) -> FinalRound:
    """Re-measure finalists, the incumbent, the default and comparators interleaved; publish the fastest
    verified config, or the config served now when the fastest is not clearly faster (:func:`keep_served`).

    The finalists are :func:`top_configs`; the study's published config (:func:`incumbent`) runs beside them,
    so that a round whose new finalists all fail on its inputs (seen on the H200: three configs at their
    error bound) publishes the incumbent again rather than the slower default; a study with no published
    config runs the carried version's config the lookup serves for its shape (:func:`carried_config`). Every
    candidate is verified on ``check_seeds`` input sets before the timing (:data:`FINAL_CHECK_SEEDS`), and one
    whose errors there came near its bounds on ``near_bound``'s extra sets (:data:`FINAL_NEAR_BOUND`; None: the
    measurer's options', none unless set there); a failure on any set is its WRONG_RESULT, and so is a config
    that passed every set within ``near_bound``'s headroom of a bound (FINAL_NEAR_BOUND: 3%). ``names`` restricts the
    comparators to those names. With ``pool`` the round's configs and its comparators marked ``prebuild``
    are first built in it, in parallel (a fresh host would otherwise build them one after another inside
    their measurements: minutes for the MIMO template, and mamba_ssm's TileLang backward alone outlives a
    120 s candidate timeout on a fresh H200); a build over twice the candidate timeout is that candidate's
    TIMEOUT, as in a trial batch. Every entry is stored (role ``final``) under one ``round_id``, failures
    included, so that the report can show what ran in the same round. ``may_publish`` is asked once the
    round is measured: False (its job was cancelled meanwhile) stores the round but publishes nothing. The
    publish itself leaves out a config a verification disproved since the round read the disproved configs
    (:meth:`tuner.store.TuningStore.publish_unless_disproved`): the next fastest is published then; with
    ``hold`` it publishes only while that worker holds the task's final round (else SlotLostError: a worker
    declared lost must not overwrite the round of the worker that took its place). ``persist`` runs the
    round's store calls once it is measured (its rows, the read of the disproved configs, ``may_publish``, the
    publish): a worker retries them through an outage (a round of the MIMO template takes minutes to
    measure again); a row whose try's answer was lost is found in the round, not stored twice.
    """
    disproved = disproved_configs(ctx)
    configs = top_configs(ctx, finalists, disproved)
    held = incumbent(ctx, disproved)
    if held is None:
        # What the lookup serves here until this version publishes (a carried version's best; None once this
        # version has a best here, this study's included): measured beside the finalists, so that a round whose
        # study never measured it (an exhaustive subspace: no warm starts) does not publish a slower config over it.
        held = carried_config(ctx.store, ctx.space, ctx.key, ctx.template.spec.carries)
        held = None if held in disproved else held
    if held is not None and held not in configs:
        configs.append(held)
    labelled: list[tuple[str, Candidate]] = [(CONFIG_LABEL, Candidate(config=c)) for c in configs]
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
    slow = {c.name for c in ctx.template.comparators() if c.prebuild}  # built in the pool too
    started = time.perf_counter()
    late = prebuild(ctx, [c.result_config() for _, c in labelled if c.comparator is None or c.comparator in slow],
                    pool)
    prebuild_s = time.perf_counter() - started if pool is not None else 0.0
    timed = [c for _, c in labelled if c.result_config() not in late]
    started = time.perf_counter()
    measured = iter(ctx.measurer.measure_interleaved(
        ctx.template_ref, ctx.shape, timed, seed=ctx.seed_base + 1_000_003, check_seeds=check_seeds,
        near_bound=near_bound,
    ) if timed else ())
    measure_s = time.perf_counter() - started
    parts = ctx.measurer.last_call_times() if timed else None
    log.info("final round of %s (%s): %d candidates, prebuild %.1f s, measured in %.1f s (%s)", ctx.template.name,
             ctx.shape.key(), len(labelled), prebuild_s, measure_s, parts.describe() if parts else "no parts")
    results = [late[key] if (key := c.result_config()) in late else next(measured) for _, c in labelled]
    persist = persist or once
    entries = tuple(
        FinalEntry(label, result, persist(_round_row(ctx, result, label, round_id)))
        for (label, _), result in zip(labelled, results, strict=True)
    )
    # read again: a verification that ran meanwhile (a round of the MIMO template takes minutes) may have
    # disproved a config this round measured right on its own inputs
    disproved = persist(lambda: disproved_configs(ctx))
    ok = [e for e in entries if not e.label.startswith(COMPARATOR_PREFIX) and e.result.ok]
    fastest_first = sorted((e for e in ok if e.config not in disproved), key=lambda e: e.median_us)
    winners = keep_served(fastest_first, held)
    refused = len(ok) - len(winners)
    winner = winners[0] if winners else None
    published = winner is not None and (may_publish is None or persist(may_publish))
    if published:
        # the store checks again, with the publish, against a verification disproving the winner since the
        # read above: then the next fastest of the round is published, or none
        winner = None
        for e in winners:
            if persist(lambda e=e: ctx.store.publish_unless_disproved(  # type: ignore[misc]
                    study_id=ctx.study_id, measurement_id=e.measurement_id, holding=hold)):
                winner = e
                break
            refused += 1
        published = winner is not None
    # through persist too: a blip here, after the publish, must not leave the task (the next claim would
    # measure and publish the whole round again); the attributes are set again as they were
    persist(lambda: _describe_round(ctx.study, entries, winner if published else None))
    # kept only when keep_served put the served config first and it was published (not when the fastest was
    # clearly faster, then disproved at the publish, and the served config came next)
    kept_over = (fastest_first[0] if winner is not None and winners and winner is winners[0]
                 and winners[0] is not fastest_first[0] else None)
    return FinalRound(round_id, entries, winner, published, refused, prebuild_s=prebuild_s, measure_s=measure_s,
                      measure_times=parts, kept_over=kept_over)


def _round_row(ctx: StudyContext, result: MeasureResult, label: str, round_id: str) -> Callable[[], int]:
    """The write of one final-round row, safe to run again: a try after the first looks for the row in the
    round first (a try whose commit went through but whose answer was lost stored it; ``round_id`` is this
    round's alone, and a round measures each label and config once)."""
    tries = 0

    def write() -> int:
        nonlocal tries
        tries += 1
        if tries > 1:
            for row in ctx.store.list_measurements(study_id=ctx.study_id, role="final", round_id=round_id):
                if row.candidate == label and Config.from_json(row.config_json) == result.config:
                    return row.id
        return store_result(ctx, result, role="final", candidate=label, round_id=round_id)

    return write


def beats_beyond_noise(challenger_p80_us: float, served_median_us: float) -> bool:
    """Whether a challenger beat the served config in one interleaved round by more than the round's noise:
    at least 80% of its samples (its p80) under the served config's median. Pure.

    Why: a final round publishes the fastest config, and a config served now was replaced on a sub-percent
    win. On the H200 (2026-12-05) 2p7b-b1-s8k's served config (`block_h` 8) lost to a `block_h` 4 one by 0.9%
    (3.68 against 3.65 µs: one step of the CUPTI timer's 32 ns, the p20–p80 ranges overlapping); the new
    config ran 24% slower than the old on the tuned H = 128 shape and as slow as the default on an unseen
    one served from it (benchmarks/h200/unseen_shapes.md). Over the committed stores' final rounds this rule
    keeps 8 of 13 chunk-cumsum replacements (gains of 0.0–2.5% on 2.5–19 µs kernels, within `tuner verify`'s
    ±3%) and none of the 13 MIMO ones (gains from 0.2% on millisecond kernels whose samples are tight). The
    figures are a round's (:class:`FinalEntry`) or a stored row's (a replayed round, :mod:`tuner.driver.rejudge`)."""
    return challenger_p80_us < served_median_us


class RankedEntry(Protocol):
    """What :func:`keep_served` reads of a round's entry: its config and its figures (a
    :class:`FinalEntry` of a round being run; a stored row's figures when a round is replayed,
    :mod:`tuner.driver.rejudge`)."""

    @property
    def config(self) -> Config: ...
    @property
    def median_us(self) -> float: ...
    @property
    def p80_us(self) -> float: ...


E = TypeVar("E", bound=RankedEntry)


def keep_served(winners: Sequence[E], served: Config | None) -> list[E]:
    """A final round's publishable entries, fastest first, with the config served now (the incumbent, or the
    carried config the lookup serves for the shape) moved to the front unless the fastest
    :func:`beats_beyond_noise` it: a published best changes on evidence, not on noise (a served config that
    changes on noise also changes what the lookup serves every neighbouring shape). Pure."""
    ranked = list(winners)
    at = next((i for i, e in enumerate(ranked) if served is not None and e.config == served), None)
    if at is None or at == 0 or beats_beyond_noise(ranked[0].p80_us, ranked[at].median_us):
        return ranked
    kept, fastest = ranked[at], ranked[0]
    log.info("final round: kept the served config %s (%.4g µs): the fastest, %s (%.4g µs, p80 %.4g), is not "
             "clearly faster", kept.config.key(), kept.median_us, fastest.config.key(), fastest.median_us,
             fastest.p80_us)
    return [ranked[at], *ranked[:at], *ranked[at + 1:]]


def prebuild(ctx: StudyContext, configs: Sequence[Config], pool: CompilePool | None) -> dict[Config, MeasureResult]:
    """Build ``configs`` (a trial batch, a final round's; a comparator as its result config,
    :meth:`tuner.measure.protocol.Candidate.result_config`) in ``pool``, in parallel, before they are measured;
    the TIMEOUT results of those whose build outlived its limit: twice the candidate's timeout (the pool's
    processes share the host's cores: a build that fits alone may not among them; one still running then
    would not fit in a measurement either). Nothing to do without a pool or for one config."""
    if pool is None or len(configs) < 2:
        return {}
    limit_s = 2 * ctx.measurer.options.timeout_s
    started = time.perf_counter()
    timed_out = pool.compile(ctx.template, configs, ctx.shape, timeout_s=limit_s).timed_out
    waited = PhaseTimes(build_s=time.perf_counter() - started)
    return {c: MeasureResult(Status.TIMEOUT, c, reason=f"no result within {limit_s:g} s while building "
                             "(parallel compile)", phases=waited) for c in timed_out}


def _describe_round(study: optuna.Study, entries: Sequence[FinalEntry], winner: FinalEntry | None) -> None:
    """The final round as study user attributes, for optuna-dashboard: its trials are the sweep only, and its
    own "best" is the fastest sweep trial, not the config published after the interleaved re-measurement."""
    study.set_user_attr("final_round", {
        e.label + ("" if e.label != CONFIG_LABEL else f" {e.result.config.key()}"):
            round(e.result.median_us, 3) if e.result.ok and e.result.median_us is not None else e.result.status.value
        for e in entries
    })
    if winner is not None:
        study.set_user_attr("published", {"median_us": round(winner.result.median_us or 0.0, 3),
                                          "config": winner.result.config.to_dict()})
