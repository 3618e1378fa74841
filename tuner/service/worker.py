"""The worker: claims tuning tasks from the store's job queue and runs their trials on one device.

One worker per device (a host with several GPUs runs one per GPU, ``--index``). A worker declares its
device kind and name, the backends it runs and its fingerprint, and only claims jobs it can satisfy. It
holds a lease renewed by a heartbeat thread; a worker that dies stops renewing it, and the next worker to
look reaps it: its reserved trial slots go back to their tasks, its Optuna trials (which stop beating)
are failed and retried with the same parameters, so the job goes on elsewhere. Measurements and trial
slots are written in one transaction: a completed measurement is never lost nor counted twice.

The worker knows the queue, the study driver and the measurer; it knows nothing of HTTP.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from tuner import db, registry
from tuner.driver.study import StudyContext, finalize, open_study
from tuner.driver.trials import run_trials
from tuner.errors import DeviceError, StoreError, TunerError, UserInputError
from tuner.measure.compile_cache import CompilePool
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import MeasureResult
from tuner.template import KernelTemplate

log = logging.getLogger(__name__)
BACKENDS = ("triton", "tilelang")


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker behaves. Immutable."""

    device: DeviceSpec = field(default_factory=DeviceSpec)
    backends: tuple[str, ...] = BACKENDS
    heartbeat_s: float = 5.0  # lease renewal and Optuna trial heartbeat interval
    lease_s: float = 30.0  # a worker silent this long is declared lost
    poll_s: float = 1.0  # idle wait between claims
    compile_workers: int = 0  # parallel compile processes for slow-compiling templates (0: the host's cores)


class SlotBudget:
    """The trial budget of one task, shared by every worker on it through slots in the store (tokens are
    slot ids). Reserved slots of a worker that dies go back to the task when its lease is reaped."""

    def __init__(self, store: db.Store, task_id: int, worker_id: str) -> None:
        self.store, self.task_id, self.worker_id = store, task_id, worker_id

    def reserve(self) -> object | None:
        with self.store.session() as session:
            return db.reserve_slot(session, task_id=self.task_id, worker_id=self.worker_id)

    def release(self, token: object) -> None:
        with self.store.session() as session:
            db.release_slot(session, slot_id=int(token))  # type: ignore[call-overload]

    def record(
        self, session: Session, token: object, *, trial_number: int, measurement_id: int, result: MeasureResult
    ) -> None:
        db.complete_slot(
            session, slot_id=int(token), trial_number=trial_number, measurement_id=measurement_id,  # type: ignore[call-overload]
            ok=result.ok, median_us=result.median_us, config_json=result.config.to_json(),
        )


class Worker:
    """A queue worker bound to one device. ``run`` blocks until ``stop`` is set (or, with
    ``exit_when_idle``, until no task is left). Not thread-safe: one ``run`` at a time."""

    def __init__(self, store: db.Store, options: WorkerOptions | None = None) -> None:
        self.store = store
        self.options = options or WorkerOptions()
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._lost = threading.Event()
        self._ctx: StudyContext | None = None
        self._pool: CompilePool | None = None

    def run(self, stop: threading.Event | None = None, *, exit_when_idle: bool = False) -> int:
        """Serve tasks; returns how many tasks this worker worked on. Raises DeviceError when the device
        cannot be used at all; store outages are waited out."""
        stop = stop or threading.Event()
        served = 0
        with Measurer(self.options.device) as measurer:
            fingerprint = measurer.fingerprint()
            with self.store.session() as session:
                db.register_worker(
                    session, worker_id=self.id, host=socket.gethostname(), pid=os.getpid(),
                    device_kind=fingerprint.kind, device_name=fingerprint.device_name,
                    device_index=self.options.device.index, backends=self.options.backends,
                    fingerprint_hash=fingerprint.hash(), fingerprint_json=fingerprint.to_json(),
                    lease_s=self.options.lease_s,
                )
            log.info("worker %s on %s:%s", self.id, fingerprint.kind, fingerprint.device_name)
            beat_stop = threading.Event()
            beat = threading.Thread(target=self._heartbeat, args=(beat_stop,), name="tuner-heartbeat", daemon=True)
            beat.start()
            try:
                while not stop.is_set() and not self._lost.is_set():
                    claim = self._claim(fingerprint.kind, fingerprint.device_name)
                    if claim is None:
                        if exit_when_idle:
                            break
                        stop.wait(self.options.poll_s)
                        continue
                    served += 1
                    self._serve(claim, measurer, stop)
            finally:
                beat_stop.set()
                beat.join(timeout=self.options.heartbeat_s + 5)
                if self._pool is not None:
                    self._pool.close()
                self._leave()
        return served

    # -- one task ---------------------------------------------------------------------------------
    def _claim(self, kind: str, name: str) -> db.Claim | None:
        try:
            with self.store.session() as session:
                lost = db.reap_lost_workers(session)
            if lost:
                log.warning("reaped lost workers %s", ", ".join(lost))
            with self.store.session() as session:
                return db.claim_task(
                    session, worker_id=self.id, device_kind=kind, device_name=name, backends=self.options.backends
                )
        except StoreError as exc:
            log.error("store unavailable, retrying: %s", exc)
            return None

    def _serve(self, claim: db.Claim, measurer: Measurer, stop: threading.Event) -> None:
        job, task = claim.job, claim.task
        try:
            template = registry.get(job.template)
            if template.version != job.template_version:
                raise UserInputError(
                    f"job wants {job.template}@{job.template_version}; this worker has @{template.version}"
                )
            shape = template.make_shape(json.loads(task.shape_json))
            measurer.set_options(MeasureOptions(n_samples=job.samples, timeout_s=job.candidate_timeout_s))
            ctx = open_study(job.template, shape, store=self.store, measurer=measurer, sampler=job.sampler,
                             seed=job.seed, heartbeat_s=self.options.heartbeat_s)
            self._ctx = ctx
            with self.store.session() as session:
                db.attach_study(session, task_id=task.id, study_id=ctx.study_id)
            self._trials(ctx, task.id, job.id, stop, self._compile_pool(template))
            if not (stop.is_set() or self._lost.is_set()):
                self._finalize(ctx, job, task.id)
        except UserInputError as exc:  # this task cannot run anywhere: say why, once
            log.error("task %s of job %s failed: %s", task.id, job.id, exc)
            with self.store.session() as session:
                db.fail_task(session, task_id=task.id, error=str(exc))
        except (StoreError, db.RecordConflictError) as exc:
            log.error("task %s of job %s interrupted: %s", task.id, job.id, exc)
        except DeviceError:
            raise
        except TunerError as exc:
            log.exception("task %s of job %s failed", task.id, job.id)
            with self.store.session() as session:
                db.fail_task(session, task_id=task.id, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._ctx = None
            try:
                with self.store.session() as session:
                    db.release_task(session, worker_id=self.id)
            except StoreError as exc:
                log.error("could not release task %s: %s", task.id, exc)

    def _compile_pool(self, template: KernelTemplate) -> CompilePool | None:
        """The worker's compile pool (kept warm across tasks) when the template compiles slowly."""
        workers = self.options.compile_workers or os.cpu_count() or 1
        if not template.compile_in_parallel or workers <= 1:
            return None
        if self._pool is None:
            self._pool = CompilePool(workers)
        return self._pool

    def _trials(
        self, ctx: StudyContext, task_id: int, job_id: int, stop: threading.Event, pool: CompilePool | None
    ) -> None:
        budget = SlotBudget(self.store, task_id, self.id)

        def should_stop() -> bool:
            if stop.is_set() or self._lost.is_set():
                return True
            with self.store.session(readonly=True) as session:
                return db.job_state(session, job_id=job_id) not in ("queued", "running")

        run_trials(ctx, budget, should_stop=should_stop, batch=pool.workers if pool else 1, compile_pool=pool)

    def _finalize(self, ctx: StudyContext, job: db.JobRecord, task_id: int) -> None:
        with self.store.session() as session:
            if not db.begin_finalize(session, task_id=task_id, worker_id=self.id):
                return  # trials still running elsewhere, or another worker finalises
        final = finalize(ctx, finalists=job.finalists, comparators=job.comparators)
        winner = final.winner.result if final.winner else None
        with self.store.session() as session:
            db.finish_task(
                session, task_id=task_id, worker_id=self.id,
                best_us=winner.median_us if winner else None,
                best_config_json=winner.config.to_json() if winner else None,
                error=None if winner else "no config passed the correctness gate",
            )

    # -- lease ------------------------------------------------------------------------------------
    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.options.heartbeat_s):
            try:
                with self.store.session() as session:
                    alive = db.heartbeat(session, worker_id=self.id, lease_s=self.options.lease_s)
                if not alive:
                    log.error("worker %s was declared lost; stopping", self.id)
                    self._lost.set()
                    return
                ctx = self._ctx
                if ctx is not None and ctx.heartbeats:
                    for trial_id in list(ctx.in_flight):
                        ctx.storage.record_heartbeat(trial_id)  # type: ignore[union-attr]
            except StoreError as exc:
                log.error("heartbeat failed: %s", exc)

    def _leave(self) -> None:
        try:
            with self.store.session() as session:
                db.stop_worker(session, worker_id=self.id)
        except StoreError as exc:
            log.error("could not deregister worker %s: %s", self.id, exc)


def parse_backends(text: str) -> tuple[str, ...]:
    """``"triton,tilelang"`` → a tuple; UserInputError for an unknown backend."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise UserInputError(f"unknown backend(s) {', '.join(unknown) or '(none)'}; known: {', '.join(BACKENDS)}")
    return names


__all__ = ["BACKENDS", "SlotBudget", "Worker", "WorkerOptions", "parse_backends"]

