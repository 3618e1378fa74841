"""The trial loop of a study: ask, check, skip known configs, (pre)compile, measure, store, tell.

Per trial: reserve a budget slot → ``ask`` → ``space.suggest`` → ``space.check`` (a violation is stored as
INVALID and the trial pruned: no compile) → a config another worker is measuring right now, or one this
study already measured, is not measured again (the trial reuses the stored value, ``duplicate_of``; an OK
value stored before trials asked the headroom below, whose errors lack it, is reused as WRONG_RESULT) →
measure in the isolated pool (a config that passes its input set within the final round's headroom of an
error bound is WRONG_RESULT: :data:`tuner.driver.study.TRIAL_NEAR_BOUND`) → store the measurement and spend
the slot in one transaction → ``tell`` (value = median device time; failures FAIL with ``status`` and
``reason`` user attributes).

With ``batch`` > 1 and a compile pool, up to ``batch`` trials are asked at once, their configs compiled in
parallel across the host's cores, then measured one after another (the measurer's builds then load from
the compile cache): the way slow-compiling backends (TileLang) are swept.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, TypeVar, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.driver import optuna_access
from tuner.driver.budget import TrialBudget
from tuner.driver.samplers import exhausted, finite_list
from tuner.driver.study import (
    CONFIG_LABEL,
    TRIAL_NEAR_BOUND,
    Persist,
    StudyContext,
    once,
    prebuild,
    settled_params,
    store_result,
)
from tuner.errors import SlotLostError
from tuner.frozen import Config, Scalar
from tuner.measure.compile_cache import CompilePool
from tuner.measure.measurer import Candidate
from tuner.results import MeasureResult, SampleSummary, Status, Timer, is_space_rejection
from tuner.store import MeasurementRecord

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class TrialRecord:
    """What one trial did; passed to progress callbacks and returned by :func:`run_trials`."""

    number: int
    config: Config
    status: Status
    median_us: float | None
    reason: str | None
    duplicate_of: int | None
    wall_s: float  # from ask to tell (in batches: including the wait for the batch's compile)
    overhead_s: float  # the trial's own wall time outside build, verification and timing (sampling, checks,
    # store, IPC, tell); the waits in a batch (its compile, the trials measured before) are left out

    @property
    def measured(self) -> bool:
        return self.status is not Status.INVALID and self.duplicate_of is None


@dataclass
class _Pending:
    trial: optuna.Trial
    config: Config
    token: object
    asked_at: float
    proposed_s: float = 0.0  # ask, suggest, checks: the trial's own share before it waits in its batch


def run_trials(
    ctx: StudyContext,
    budget: TrialBudget,
    *,
    on_trial: Callable[[TrialRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_skips: int | None = None,
    batch: int = 1,
    compile_pool: CompilePool | None = None,
    persist: Persist | None = None,
) -> list[TrialRecord]:
    """Run trials while the budget grants slots. Invalid and duplicate configs cost no slot; at most
    ``max_skips`` of them in a row (default 200) end the loop (``ctx.stalled``), as does an exhausted grid. After
    every :data:`LOOK_AFTER_SKIPS` of them in a row the space is looked at (:func:`unseen_config`): a valid config
    the study lacks is queued for the next ask (a sampler that keeps proposing known configs would otherwise end
    the search with configs left), and a study that holds every valid config ends the loop there (samplers of a
    finite list, grid and exhaustive, are left to their own end: their list may be a subspace). With trial
    heartbeats on, trials of workers that stopped beating are failed (and so retried) before each ask.

    ``persist(write)`` runs the writes that record a measurement already taken (store, tell): a worker
    passes one that retries them until the store answers again, so that a measurement taken during an
    outage is kept; by default they run once. Other store errors propagate (what was asked and not
    measured is abandoned: failed, its slot freed, its config queued again)."""
    records: list[TrialRecord] = []
    skips, limit = 0, 200 if max_skips is None else max_skips
    everything = False  # the loop ended because the study holds every valid config of the shape

    def emit(record: TrialRecord) -> None:
        records.append(record)
        if on_trial:
            on_trial(record)

    while not (should_stop and should_stop()) and skips < limit:
        pending: list[_Pending] = []
        while len(pending) < max(1, batch) and skips < limit:
            _fail_stale_trials(ctx)
            if exhausted(ctx.sampler, ctx.study):
                break
            token = budget.reserve()
            if token is None:
                break
            outcome = _propose(ctx, token)
            if isinstance(outcome, TrialRecord):
                budget.release(token)
                skips += 1
                emit(outcome)
                if skips < limit and looks_at_space(skips, ctx.sampler):
                    unseen = unseen_config(ctx)
                    if unseen is False:
                        skips, everything = limit, True  # the study holds every valid config: nothing to ask
                    elif unseen is not None:
                        ctx.study.enqueue_trial(unseen.to_dict())  # the next ask takes it
            else:
                pending.append(outcome)
        if not pending:
            break
        skips = 0
        _measure_batch(ctx, budget, pending, compile_pool, emit, persist or once)
    ctx.stalled = skips >= limit
    if ctx.stalled:
        log.info("stopped %s: %s", ctx.key.study_name(), "the study holds every valid config" if everything
                 else f"{skips} invalid or duplicate configs in a row")
    return records


# Invalid or known proposals in a row after which the trial loop looks for a valid config the study lacks.
LOOK_AFTER_SKIPS = 20
# Valid configs of a shape, at most, for that look: a space with more is left to its sampler (its valid
# configs are not enumerated; the TileLang chunk cumsum space has ~10^7 points and over 200 000 valid per shape).
ENUMERABLE_VALID = 4096


def unseen_config(ctx: StudyContext) -> Config | Literal[False] | None:
    """A valid config of the study's shape that the study does not hold, chosen at random (seeded by the
    study's seed and trial count, and with trial heartbeats on by this worker: workers sharing the study rarely
    pick the same one).
    Held: what a warm start must not repeat (:func:`tuner.driver.study.settled_params`: measured, pruned as a
    duplicate, failed with a measurement, running on a worker that beats) and the trials in flight here; a
    config left RUNNING by a killed run, rejected under earlier constraints, or failed without a measurement
    is not held. False when every valid config is held; None when the study's queue is not empty (the next
    ask takes a queued config) or the shape has more than :data:`ENUMERABLE_VALID` valid configs (not looked
    at). The valid configs are enumerated once per context."""
    if ctx.valid_configs is None:
        valid = list(itertools.islice(ctx.space.valid_configs(ctx.shape), ENUMERABLE_VALID + 1))
        ctx.enumerable = len(valid) <= ENUMERABLE_VALID
        ctx.valid_configs = tuple(valid) if ctx.enumerable else ()
    if not ctx.enumerable or optuna_access.waiting_trials(ctx.study):
        return None
    trials = ctx.study.get_trials(deepcopy=False)
    held = {Config(cast("dict[str, Scalar]", p))
            for p in settled_params(ctx.study, heartbeats=ctx.heartbeats, waiting=False, trials=trials)}
    held.update(Config(t.params) for t in trials if optuna_access.trial_id(t) in ctx.in_flight)
    # workers sharing the study (heartbeats on) pick apart; a run of its own repeats with its seed
    pick = pick_unseen(ctx.valid_configs, held, f"{ctx.seed_base}/{ctx.worker if ctx.heartbeats else ''}/{len(trials)}")
    return False if pick is None else pick


def looks_at_space(skips: int, sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether the trial loop looks for a config the study lacks after ``skips`` proposals in a row that needed
    no measurement: at every :data:`LOOK_AFTER_SKIPS`-th, unless the sampler walks a finite list of its own
    (grid, exhaustive: the list may be a subspace, and it ends the loop itself). Pure; benchmarks/search.py's
    replay asks it too."""
    return skips > 0 and skips % LOOK_AFTER_SKIPS == 0 and not finite_list(sampler)


def pick_unseen(valid: Sequence[Config], held: Container[Config], seed: str) -> Config | None:
    """A config of ``valid`` not in ``held``, chosen by ``random.Random(seed)`` (the same seed, the same pick);
    None when ``held`` holds them all. Pure; benchmarks/search.py's replay picks with it too."""
    unseen = [c for c in valid if c not in held]
    return random.Random(seed).choice(unseen) if unseen else None


def _measure_batch(
    ctx: StudyContext, budget: TrialBudget, pending: list[_Pending], pool: CompilePool | None,
    emit: Callable[[TrialRecord], None], persist: Persist,
) -> None:
    try:
        # A build still running after its limit is the candidate's TIMEOUT, recorded as measured (its build
        # time is the wait).
        late = prebuild(ctx, [p.config for p in pending], pool)
        while pending:
            p = pending[0]
            emit(_measure(ctx, budget, p, persist, late.get(p.config)))
            pending.pop(0)
    finally:
        for p in pending:  # interrupted: no RUNNING trial and no reserved slot is left behind
            if optuna_access.trial_id(p.trial) in ctx.in_flight:  # not already abandoned by _measure
                _abandon(ctx, budget, p, "not measured: the loop was interrupted")


def _propose(ctx: StudyContext, token: object) -> TrialRecord | _Pending:
    """Ask a trial and resolve it when no measurement is needed (invalid, in flight elsewhere, known)."""
    started = time.perf_counter()
    trial = optuna_access.ask(ctx.study)
    # Beat at once: a trial without any heartbeat is never found stale if its process dies early.
    optuna_access.record_heartbeat(ctx.storage, optuna_access.trial_id(trial))
    config = ctx.space.suggest(trial)
    reason = ctx.space.check(config, ctx.shape)
    if reason is not None:
        result = MeasureResult(Status.INVALID, config, reason=reason)
        measurement_id = store_result(ctx, result, role="trial", candidate=CONFIG_LABEL, trial_number=trial.number)
        _tell(ctx, trial, result, measurement_id)
        return _record(trial.number, result, None, started)
    twin = _in_flight_twin(ctx, trial.number, config)
    if twin is not None:
        # Another worker sharing the study measures this config right now: do not measure it twice.
        trial.set_user_attr("duplicate_of", twin)
        trial.set_user_attr("status", "DUPLICATE")
        ctx.study.tell(trial, state=TrialState.PRUNED)
        result = MeasureResult(Status.INVALID, config, reason=f"config in flight in trial {twin}")
        return _record(trial.number, result, twin, started)
    previous = _previous_measurement(ctx, config)
    if previous is not None:
        trial.set_user_attr("duplicate_of", previous.trial_number)
        result = _duplicate_result(ctx, previous)
        _tell(ctx, trial, result, previous.id)
        return _record(trial.number, result, previous.trial_number, started)
    ctx.in_flight.add(optuna_access.trial_id(trial))
    return _Pending(trial, config, token, started, time.perf_counter() - started)


def _measure(
    ctx: StudyContext, budget: TrialBudget, p: _Pending, persist: Persist, given: MeasureResult | None = None,
) -> TrialRecord:
    """Measure a pending trial (or take ``given``, its outcome known without measuring) and store it."""
    trial = p.trial
    measuring_from = time.perf_counter()
    try:
        result = given if given is not None else ctx.measurer.measure(
            ctx.template_ref, ctx.shape, Candidate(config=p.config), seed=ctx.seed_base + trial.number,
            near_bound=TRIAL_NEAR_BOUND,
        )
        measurement_id = persist(lambda: _store_trial(ctx, budget, p, result))
    except BaseException as exc:
        # Not stored (slot lost, interrupted, the worker stopping in an outage): fail the trial, free the
        # slot, let the caller decide.
        _abandon(ctx, budget, p, f"not recorded: {type(exc).__name__}: {exc}")
        raise
    ctx.in_flight.discard(optuna_access.trial_id(trial))
    persist(lambda: _tell_stored(ctx, trial, result, measurement_id))
    # Overhead: its own proposal and measurement call, not the wait for its batch's compile and for the
    # trials measured before it in the batch (those are in wall_s).
    return _record(trial.number, result, None, p.asked_at,
                   own_s=p.proposed_s + (time.perf_counter() - measuring_from))


def _store_trial(ctx: StudyContext, budget: TrialBudget, p: _Pending, result: MeasureResult) -> int:
    """Store a trial's measurement on its slot; the measurement id.

    A slot given back while this worker could not reach the store (its lease lapsed and it was reaped:
    SlotLostError) does not lose the measurement when it can be kept without measuring a config twice or
    exceeding the trial count: the trial must still be this worker's (RUNNING: no other worker failed it
    for a stale heartbeat and queued its config again) and the task must have a trial left, on a new slot.
    Otherwise the SlotLostError propagates (the caller abandons the trial, its config queued again)."""
    try:
        return store_result(ctx, result, role="trial", candidate=CONFIG_LABEL, trial_number=p.trial.number,
                            slot_id=budget.slot_of(p.token))
    except SlotLostError:
        trial_id = optuna_access.trial_id(p.trial)
        optuna_access.record_heartbeat(ctx.storage, trial_id)  # ours again before anyone finds it stale
        if ctx.storage.get_trial(trial_id).state is not TrialState.RUNNING:
            raise
        token = budget.reserve()
        if token is None:  # the task's trials were all taken meanwhile: keeping it would exceed them
            raise
        p.token = token
        log.warning("trial %d: its slot was given back while the store was unreachable; stored on a new slot",
                    p.trial.number)
    return store_result(ctx, result, role="trial", candidate=CONFIG_LABEL, trial_number=p.trial.number,
                        slot_id=budget.slot_of(p.token))


def _abandon(ctx: StudyContext, budget: TrialBudget, p: _Pending, reason: str) -> None:
    """Fail a trial that was asked but not measured, free its slot, and queue its config again (WAITING),
    so that the next run of the study measures it: an interrupted run loses no seed or proposal."""
    ctx.in_flight.discard(optuna_access.trial_id(p.trial))
    try:
        # queued again before the trial is failed and its slot freed: a worker whose search stalls ends it
        # only while nothing waits in the queue, and never sees this config neither asked nor queued
        ctx.study.enqueue_trial(p.config.to_dict())
        p.trial.set_user_attr("reason", reason[:2000])
        ctx.study.tell(p.trial, state=TrialState.FAIL)
        budget.release(p.token)
    except Exception:  # the store may be what failed; Optuna's heartbeat retry covers the trial then
        log.exception("could not abandon trial %d cleanly", p.trial.number)


def _fail_stale_trials(ctx: StudyContext) -> None:
    """Fail (and so retry) the trials of workers that stopped beating, and the orphans Optuna cannot see:
    a worker killed between asking a trial and its first heartbeat leaves a RUNNING trial with neither a
    heartbeat nor parameters. A live worker suggests right after its first beat, so such a trial older
    than the grace period has no owner: it is failed, and queued again if it held an enqueued config (a
    seed or a retry), whose fixed parameters it carries."""
    if not ctx.heartbeats:
        return
    optuna_access.fail_stale_trials(ctx.study)
    storage = ctx.storage
    interval, grace = optuna_access.heartbeat_timing(storage)
    if time.monotonic() - ctx.orphans_checked_at < interval:  # at most once per heartbeat interval: the
        return  # scan reads every RUNNING trial, and it runs before every ask
    ctx.orphans_checked_at = time.monotonic()
    cutoff = datetime.now() - timedelta(seconds=grace)  # Optuna stores naive local start times
    for trial in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = optuna_access.trial_id(trial)
        if not trial.params and trial_id not in ctx.in_flight and trial.datetime_start \
                and trial.datetime_start < cutoff:
            try:
                storage.set_trial_user_attr(trial_id, "reason", "orphaned: its worker died "
                                            "before the trial's first heartbeat")
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
            except Exception:  # another worker failed it first (it is finished now): nothing to do
                log.debug("orphan trial %d already settled", trial.number, exc_info=True)
                continue
            if optuna_access.has_fixed_params(trial):
                ctx.study.enqueue_trial(optuna_access.queued_params(trial))


def _record(
    number: int, result: MeasureResult, duplicate_of: int | None, started: float, own_s: float | None = None
) -> TrialRecord:
    """The trial's record: wall time since ``started``; overhead = ``own_s`` (the trial's own wall time,
    default: all of it) minus the measurement's phases."""
    wall = time.perf_counter() - started
    phases = result.phases
    spent = phases.build_s + phases.verify_s + phases.measure_s
    return TrialRecord(
        number, result.config, result.status, result.median_us, result.reason, duplicate_of, wall,
        max(0.0, (wall if own_s is None else own_s) - spent),
    )


def _tell_stored(ctx: StudyContext, trial: optuna.Trial, result: MeasureResult, measurement_id: int) -> None:
    """Tell a trial whose measurement is stored; if Optuna already finished it (its heartbeats stopped
    during an outage, so another worker failed it and queued its config again), the stored measurement
    stands: the queued copy finds it and counts as a duplicate, measuring nothing."""
    try:
        _tell(ctx, trial, result, measurement_id)
    except optuna.exceptions.UpdateFinishedTrialError:
        log.info("trial %d was finished by another worker during an outage; its measurement %d is kept",
                 trial.number, measurement_id)


def _tell(ctx: StudyContext, trial: optuna.Trial, result: MeasureResult, measurement_id: int) -> None:
    trial.set_user_attr("status", result.status.value)  # readable where the dashboard says Pruned or Fail
    trial.set_user_attr("role", "trial")  # the final round is in the study's "final_round" attribute
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


def _in_flight_twin(ctx: StudyContext, number: int, config: Config) -> int | None:
    """The number of an earlier RUNNING trial of the study with the same parameters, if any: one asked before
    this one (its start, then its number: a queued trial's number dates from its queueing, its start from its
    ask). Only an earlier one: two workers that asked the same config at once (both took the one config left
    unseen, queued by each) would otherwise each find the other in flight, both step aside, and the config
    would count as settled without ever being measured (seen in CI: a TPE search of 7 valid configs ended
    with its only correct one unmeasured). Both read the same stored starts and numbers, so exactly one of
    them steps aside. Without heartbeats only this process's own trials count: a RUNNING trial of another
    process is then one of a run killed outright (see tuner.driver.study.settled_params), which will never
    be measured."""
    params = config.to_dict()
    running = ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    mine = next((t for t in running if t.number == number), None)
    if mine is None:  # failed meanwhile as stale by another worker: measured (its tell tolerates that), not pruned
        return None

    def asked(t: FrozenTrial) -> tuple[datetime, int]:
        return t.datetime_start or datetime.max, t.number

    me = asked(mine)
    for other in running:
        live = ctx.heartbeats or optuna_access.trial_id(other) in ctx.in_flight
        if other.number != number and asked(other) < me and live and other.params == params:
            return other.number
    return None


def _previous_measurement(ctx: StudyContext, config: Config) -> MeasurementRecord | None:
    """The study's earliest stored trial of ``config``, rejections by the space left out
    (:func:`~tuner.results.is_space_rejection`): the config passed the space's check just now, so such a row
    was written under an earlier, stricter version of its constraints and says nothing about its speed."""
    rows = ctx.store.list_measurements(study_id=ctx.study_id, role="trial", config_json=config.to_json())
    return next((r for r in rows if not is_space_rejection(r.status, r.reason)), None)


def _duplicate_result(ctx: StudyContext, row: MeasurementRecord) -> MeasureResult:
    """What a duplicate trial of ``row``'s config reports: the stored outcome (:func:`_result_of`), except for
    an OK row stored before trials asked :data:`TRIAL_NEAR_BOUND`'s headroom whose errors lack it, which is
    WRONG_RESULT, as a trial of its config is now (the stored row itself is left as it was measured)."""
    result = _result_of(row)
    short = TRIAL_NEAR_BOUND.why_short(result.errors, ctx.template.error_bounds(ctx.shape)) if result.ok else None
    if short is None:
        return result
    reason = f"stored OK in trial {row.trial_number} before trials asked the headroom: {short}"
    return dataclasses.replace(result, status=Status.WRONG_RESULT, summary=None, reason=reason)


def _result_of(row: MeasurementRecord) -> MeasureResult:
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


