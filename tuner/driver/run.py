"""One study driven from start to end: open (with warm starts) → trial loop → final round → publish.

Both drivers of the engine assemble it here: ``tuner tune`` (:mod:`tuner.driver.tuning`, a local count of
trials) and the queue worker (:mod:`tuner.service.worker`, trial slots shared with other workers through
the store, a final round taken by exactly one worker). The hooks say what differs between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna

from tuner.driver.budget import TrialBudget
from tuner.driver.study import FinalRound, Persist, StudyContext, finalize, open_study
from tuner.driver.trials import TrialRecord, run_trials
from tuner.frozen import Shape
from tuner.measure.compile_cache import CompilePool
from tuner.measure.contract import Measuring
from tuner.store import RoundHold, TuningStore


@dataclass(frozen=True)
class StudyOptions:
    """How one study is driven. Immutable."""

    sampler: str | optuna.samplers.BaseSampler = "tpe"  # a name (tuner.driver.samplers) or an instance
    seed: int | None = None
    finalists: int = 3
    comparators: bool = True
    heartbeat_s: float | None = None  # Optuna trial heartbeats (studies shared by workers)
    warm: bool = True  # queue the warm starts (default, seeds, neighbours' bests) first
    device_index: int | None = None  # the measuring device's index on its host, recorded with each measurement


@dataclass(frozen=True)
class StudyRun:
    """What one drive of a study did: its context, its trials, and its final round (None when the round was
    not run here: stopped, or another worker's to run)."""

    ctx: StudyContext
    trials: tuple[TrialRecord, ...]
    final: FinalRound | None


def run_study(
    template: str,
    shape: Shape,
    *,
    store: TuningStore,
    measurer: Measuring,
    budget: TrialBudget,
    options: StudyOptions = StudyOptions(),
    pool: CompilePool | None = None,
    on_open: Callable[[StudyContext], None] | None = None,
    on_trial: Callable[[TrialRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    take_final_round: Callable[[], bool] | None = None,
    persist: Persist | None = None,
    may_publish: Callable[[], bool] | None = None,
    hold: RoundHold | None = None,
) -> StudyRun:
    """Open the study of (template, shape, the measurer's device), run trials while ``budget`` grants them
    and ``should_stop`` says no, then, unless stopped and if ``take_final_round`` says so (default: yes),
    re-measure the finalists and publish the best. ``on_open`` sees the context before the first trial;
    ``persist`` runs the writes of a measurement already taken, the trials' and the final round's (see
    :func:`~tuner.driver.trials.run_trials`); ``may_publish`` is asked before the final round publishes, which
    ``hold`` ties to the worker's hold on the task's final round (see :func:`~tuner.driver.study.finalize`).

    Raises what :func:`~tuner.driver.study.open_study`, the trial loop and the final round raise
    (UnknownTemplateError, SearchSpaceError, StoreError, DeviceError, RecordConflictError for a lost slot).
    """
    ctx = open_study(template, shape, store=store, measurer=measurer, sampler=options.sampler, seed=options.seed,
                     heartbeat_s=options.heartbeat_s, warm=options.warm, device_index=options.device_index)
    if on_open is not None:
        on_open(ctx)
    records = run_trials(ctx, budget, on_trial=on_trial, should_stop=should_stop,
                         batch=pool.workers if pool else 1, compile_pool=pool, persist=persist)
    final = None
    stopped = should_stop is not None and should_stop()
    if not stopped and (take_final_round is None or take_final_round()):
        final = finalize(ctx, finalists=options.finalists, comparators=options.comparators, pool=pool,
                         may_publish=may_publish, persist=persist, hold=hold)
    return StudyRun(ctx, tuple(records), final)
