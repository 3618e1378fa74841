"""The worker: claims tasks from the store's job queue and runs them on one device: a tuning job's trials and
final round, or a verify job's re-measurement of a published best (:mod:`tuner.driver.reverify`).

One worker per device (a host with several GPUs runs one per GPU, ``--index``). A worker declares its
device kind and name, the backends it runs and its fingerprint, and only claims jobs it can satisfy. It
holds a lease renewed by a heartbeat thread; a worker that dies stops renewing it, and the next worker to
look reaps it: its reserved trial slots go back to their tasks, its Optuna trials (which stop beating)
are failed and retried with the same parameters, so the job goes on elsewhere. Measurements and trial
slots are written in one transaction: a completed measurement is never lost nor counted twice.

Store outages are waited out (:mod:`tuner.db.retry`): every store error in the loop is retried with
capped exponential backoff and jitter, logged once per outage; a measurement taken while the store is down
(a trial's, or a final round's rows and its publish) is kept and written when it is back, each write safe to
run again after a try whose answer was lost at commit (the registration too); leaving a task gives back every
slot not being measured, and a lease that lapsed meanwhile is rejoined. A final round publishes only while
this worker still holds it (:class:`tuner.store.RoundHold`): declared lost meanwhile, it leaves the round to
the worker that took it. After its own reconnection a worker waits one lease before reaping
others, so that live workers cut off by the same outage can renew first. SIGTERM (``stop``) ends the
candidate being measured at once (its process is killed, its config queued again).

Mixed fleets: a worker advertises the templates it has (name → version, from the registry's specs) when it
registers, and claims only tasks of those. When it cannot load a template it advertised (the implementation
does not import, another version), it stops advertising it (``JobQueue.withdraw_template``) and leaves the
task to the others, charging nothing to it. When its device fails while running a task, it gives the task
up (``JobQueue.fail_attempt``: the worker and the reason recorded) and stops; the store fails the task only
once the job's ``max_attempts`` workers gave it up and no live worker is on it or may still take it.

The worker knows the queue and store contracts (:mod:`tuner.store`), the study driver and the measurer; it
knows nothing of HTTP or SQL. Liveness (the lease and the trials' heartbeats) is one
:class:`~tuner.driver.heartbeat.Heartbeat`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tuner import registry
from tuner.db.retry import STORAGE_ERRORS, StoreHealth, durable
from tuner.driver import optuna_access
from tuner.driver.heartbeat import Heartbeat
from tuner.driver.reverify import STAND_INS, Verification, disproval_text, verdict_text, verify_served
from tuner.driver.run import StudyOptions, StudyRun, run_study
from tuner.driver.samplers import exhausted
from tuner.driver.study import FinalRound, StudyContext
from tuner.errors import (
    DeviceError,
    MeasureInterrupted,
    MeasureSetupError,
    RecordConflictError,
    TunerError,
    UserInputError,
)
from tuner.frozen import Shape
from tuner.measure.compile_cache import CompilePool
from tuner.measure.devices.base import DeviceSpec, Fingerprint
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import COMPARATOR_PREFIX
from tuner.store import Claim, JobQueue, JobRecord, RoundHold, TuningStore
from tuner.store.records import ACTIVE_JOB_STATES
from tuner.template import KernelTemplate

log = logging.getLogger(__name__)
BACKENDS = ("triton", "tilelang")
T = TypeVar("T")
# Errors on which a worker leaves its task (and claims again later) rather than failing it.
LEAVE_TASK_ERRORS: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, RecordConflictError)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker behaves. Immutable."""

    device: DeviceSpec = field(default_factory=DeviceSpec)
    backends: tuple[str, ...] = BACKENDS
    heartbeat_s: float = 5.0  # lease renewal and Optuna trial heartbeat interval
    # a worker silent this long is declared lost. On PostgreSQL keep it above 20 s: a heartbeat whose COMMIT
    # never reached the server leaves its transaction holding the worker's row until the server ends it
    # (TUNER_DB idle_in_transaction_s, 12 s), and the worker's next beats wait on that row meanwhile
    lease_s: float = 30.0
    poll_s: float = 1.0  # idle wait between claims
    compile_workers: int = 0  # parallel compile processes for slow-compiling templates (0: the host's cores)
    device_index: int | None = None  # the index it registers and records (default device.index); a worker
    # pinned to one GPU (tuner.service.fleet) sees it as cuda:0 but registers the GPU's index on the host
    stand_ins: int = STAND_INS  # a verify task: stand-ins verified in turn after a disproval (verify_served)

    def __post_init__(self) -> None:
        """UserInputError for intervals that cannot work: a lease must outlast two heartbeats (one late beat
        must not get a live worker reaped)."""
        if not (self.heartbeat_s > 0 and self.poll_s > 0):
            raise UserInputError(f"heartbeat ({self.heartbeat_s:g} s) and poll ({self.poll_s:g} s) must be positive")
        if self.lease_s <= 2 * self.heartbeat_s:
            raise UserInputError(f"the lease ({self.lease_s:g} s) must exceed twice the heartbeat "
                                 f"({self.heartbeat_s:g} s)")


class QueueStore(TuningStore, JobQueue, Protocol):
    """What a worker needs: the tuning store and the job queue (one database; ``tuner.db.Store`` is both)."""


class SlotBudget:
    """The trial budget of one task, shared by every worker on it through slots in the store (tokens are
    slot ids, spent with the measurement). Reserved slots of a worker that dies go back to the task when
    its lease is reaped."""

    def __init__(self, queue: JobQueue, task_id: int, worker_id: str) -> None:
        self.queue, self.task_id, self.worker_id = queue, task_id, worker_id

    def reserve(self) -> object | None:
        return self.queue.reserve_slot(task_id=self.task_id, worker_id=self.worker_id)

    def release(self, token: object) -> None:
        self.queue.release_slot(slot_id=int(token))  # type: ignore[call-overload]

    def slot_of(self, token: object) -> int | None:
        return int(token)  # type: ignore[call-overload]


def _no_winner(final: FinalRound) -> str:
    """Why a final round published nothing: its configs' outcomes, counted (all WRONG_RESULT is the
    correctness gate; TIMEOUTs under a busy host or build errors are not), or that those that ran OK were
    disproved (by a verification, or an earlier round, since the round began)."""
    outcomes = Counter(e.result.status.value for e in final.entries if not e.label.startswith(COMPARATOR_PREFIX))
    counted = ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items()))
    if final.disproved:
        return (f"every config of the final round that ran OK was found wrong by a verification or a final "
                f"round ({final.disproved} disproved; {counted})")
    return f"no config of the final round ran correctly ({counted or 'no config to run'})"


class Worker:
    """A queue worker bound to one device. ``run`` blocks until ``stop`` is set (or, with
    ``exit_when_idle``, until no task is left). Not thread-safe: one ``run`` at a time."""

    def __init__(self, store: QueueStore, options: WorkerOptions | None = None) -> None:
        self.store = store
        self.options = options or WorkerOptions()
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._lost = threading.Event()
        self._pool: CompilePool | None = None
        self.health = StoreHealth()
        self._stop = threading.Event()
        self._lacking: dict[tuple[str, str], str] = {}  # (template, version) it cannot run → why
        self._fingerprint: Fingerprint | None = None  # as registered
        self._heartbeat = self._new_heartbeat()

    def _new_heartbeat(self) -> Heartbeat:
        return Heartbeat(self.store, self.id, interval_s=self.options.heartbeat_s, lease_s=self.options.lease_s,
                         on_lost=self._lost.set, health=self.health)

    def _durable(self, call: Callable[[], T]) -> T:
        """``call()`` (a store operation), retried through outages until it succeeds or the worker stops."""
        return durable(call, self.health, self._stop)

    @property
    def device_index(self) -> int:
        """The device index this worker registers and records with its measurements."""
        index = self.options.device_index
        return self.options.device.index if index is None else index

    def run(self, stop: threading.Event | None = None, *, exit_when_idle: bool = False) -> int:
        """Serve tasks; returns how many tasks this worker worked on. Raises DeviceError when the device
        cannot be used at all; store outages are waited out (a stop during one ends the wait)."""
        self._stop = stop = stop or threading.Event()
        served = 0
        with Measurer(self.options.device) as measurer:
            fingerprint = self._fingerprint = measurer.fingerprint()
            self._durable(lambda: self._register(fingerprint))
            log.info("worker %s on %s:%s", self.id, fingerprint.kind, fingerprint.device_name)
            self._heartbeat = self._new_heartbeat()
            self._heartbeat.start()
            done = threading.Event()
            threading.Thread(target=self._interrupt_on_stop, args=(measurer, done), name="tuner-stop",
                             daemon=True).start()
            try:
                while not stop.is_set():
                    if self._lost.is_set():
                        self._rejoin()
                    claim = self._durable(lambda: self._claim(fingerprint.kind, fingerprint.device_name))
                    if claim is None:
                        if exit_when_idle:
                            break
                        stop.wait(self.options.poll_s)
                        continue
                    served += 1
                    self._serve(claim, measurer, stop)
            except STORAGE_ERRORS:
                if not stop.is_set():
                    raise
            finally:
                done.set()
                self._heartbeat.stop()
                if self._pool is not None:
                    self._pool.close()
                    self._pool = None  # interrupted by a stop, it builds nothing more: a later run starts anew
                self._leave()
        log.info("worker %s left after %d task(s)", self.id, served)
        return served

    def _register(self, fingerprint: Fingerprint) -> None:
        self.store.register_worker(
            worker_id=self.id, host=socket.gethostname(), pid=os.getpid(),
            device_kind=fingerprint.kind, device_name=fingerprint.device_name,
            device_index=self.device_index, backends=self.options.backends,
            fingerprint_hash=fingerprint.hash(), fingerprint_json=fingerprint.to_json(),
            lease_s=self.options.lease_s, templates=advertised_templates(),
        )

    def _rejoin(self) -> None:
        """Declared lost while alive (cut off longer than the lease): back in the queue with a new lease."""
        self._heartbeat.stop()
        if self._durable(lambda: self.store.rejoin_worker(worker_id=self.id, lease_s=self.options.lease_s)):
            log.warning("worker %s was declared lost while cut off from the store; rejoined", self.id)
        else:  # its row is gone (a store reset or cleaned up): register anew, or it would rejoin forever
            fingerprint = self._fingerprint
            assert fingerprint is not None, "a worker rejoins only after it registered"
            self._durable(lambda: self._register(fingerprint))
            log.warning("worker %s was unknown to the store when it came back; registered again", self.id)
        self._lost.clear()
        self._heartbeat = self._new_heartbeat()
        self._heartbeat.start()

    def _interrupt_on_stop(self, measurer: Measurer, done: threading.Event) -> None:
        # SIGTERM sets `stop`: the candidate being measured must not be waited for (it may hang).
        while not self._stop.wait(0.1):
            if done.is_set():
                return
        log.info("worker %s stopping: the measurement or parallel build in progress is ended", self.id)
        measurer.interrupt()
        pool = self._pool
        if pool is not None:  # a batch of builds (up to twice the candidate timeout each) is not waited for
            pool.interrupt()

    def _job_active(self, job_id: int) -> bool:
        """Whether the job is still queued or running: not cancelled (nor finished) meanwhile, so that its
        results may be published. Raises what the store raises."""
        return self.store.job_state(job_id=job_id) in ACTIVE_JOB_STATES

    def _interrupt_on_cancel(self, job_id: int, pool: CompilePool, done: threading.Event,
                             cancelled: threading.Event) -> None:
        """While a task runs (until ``done``), look at its job's state every heartbeat: once the job is no
        longer active (cancelled over the API), set ``cancelled`` and interrupt ``pool``: the batch of builds
        in progress (up to twice the candidate timeout each) is ended and its compilers killed. The sweep
        itself stops at its next trial (``should_stop``). A store outage skips a look."""
        while not done.wait(self.options.heartbeat_s):
            try:
                active = self._job_active(job_id)
            except STORAGE_ERRORS:
                continue
            if not active and not done.is_set():
                cancelled.set()
                pool.interrupt()
                return

    # -- one task ---------------------------------------------------------------------------------
    def _claim(self, kind: str, name: str) -> Claim | None:
        # Reap only once this worker has been connected for a lease: after an outage, workers that are
        # alive but were cut off too must have had the time to renew their leases first.
        if time.monotonic() - self.health.back_at >= self.options.lease_s:
            lost = self.store.reap_lost_workers()
            if lost:
                log.warning("reaped lost workers %s", ", ".join(lost))
        return self.store.claim_task(
            worker_id=self.id, device_kind=kind, device_name=name, backends=self.options.backends
        )

    def _serve(self, claim: Claim, measurer: Measurer, stop: threading.Event) -> None:
        job, task = claim.job, claim.task
        task_done, cancelled = threading.Event(), threading.Event()
        watcher: threading.Thread | None = None
        try:
            template = self._template_of(job)
            if isinstance(template, str):  # another worker of the fleet may have it: leave the task to it
                key = (job.template, job.template_version)
                self._durable(lambda: self.store.withdraw_template(worker_id=self.id, template=key[0],
                                                                   version=key[1]))
                return
            shape = template.make_shape(json.loads(task.shape_json))
            if job.kind == "verify":
                self._verify(job, task.id, shape)
                return
            measurer.set_options(MeasureOptions(n_samples=job.samples, timeout_s=job.candidate_timeout_s))
            pool = self._compile_pool(template)
            if pool is not None:  # a batch of builds can take minutes: a cancel must not wait for its end
                watcher = threading.Thread(target=self._interrupt_on_cancel, args=(job.id, pool, task_done, cancelled),
                                           name="tuner-cancel", daemon=True)
                watcher.start()
            run = self._drive(job, task.id, shape, measurer, stop, pool)
            if run.final is not None:
                self._finish(run, task.id)
        except MeasureInterrupted:
            if cancelled.is_set() and not stop.is_set():
                log.info("task %s of job %s: the job was cancelled; its parallel build was ended", task.id, job.id)
            else:
                log.info("task %s of job %s: measurement interrupted, the worker stops", task.id, job.id)
        except UserInputError as exc:  # this task cannot run anywhere: say why, once
            log.error("task %s of job %s failed: %s", task.id, job.id, exc)
            reason = str(exc)
            self._durable(lambda: self.store.fail_task(task_id=task.id, error=reason))
        except LEAVE_TASK_ERRORS as exc:
            # The store went away (or took back what this worker held): leave the task, claim again later.
            if isinstance(exc, STORAGE_ERRORS):
                self.health.failed(exc)
            if isinstance(exc, RecordConflictError) and self._job_cancelled(job.id):
                log.info("task %s of job %s: the job was cancelled while the task ran; what was measured is "
                         "stored, nothing more is published", task.id, job.id)
            else:
                log.info("task %s of job %s interrupted: %s: %s", task.id, job.id, type(exc).__name__, exc)
        except DeviceError as exc:  # the device failed on this task: give the task up, then stop
            self._give_up(task.id, f"{type(exc).__name__}: {exc}")
            raise
        except MeasureSetupError as exc:
            # Its measurement could not be set up here (its measuring process would not start, the inputs
            # or reference ran out of this device's memory...): maybe this host's, maybe the task's. Give
            # it up, as a device failure: the task fails once its job's max_attempts workers gave it up.
            log.warning("task %s of job %s: measurement setup failed: %s", task.id, job.id, exc)
            self._give_up(task.id, f"{type(exc).__name__}: {exc}")
        except TunerError as exc:
            log.exception("task %s of job %s failed", task.id, job.id)
            error = f"{type(exc).__name__}: {exc}"
            self._durable(lambda: self.store.fail_task(task_id=task.id, error=error))
        finally:
            task_done.set()
            if watcher is not None:
                watcher.join()  # it interrupts nothing after this: a late interrupt would fail the next task
            if cancelled.is_set() and self._pool is not None:  # interrupted for good: the next task starts anew
                self._pool.close()
                self._pool = None
            self._heartbeat.detach()
            try:  # leave the task and give back every slot not measured: retried through an outage
                self._durable(lambda: self.store.release_task(worker_id=self.id))
            except STORAGE_ERRORS as exc:  # stopping in an outage: the lease lapses, the reaper frees them
                log.error("could not release task %s: %s", task.id, exc)

    def _job_cancelled(self, job_id: int) -> bool:
        """Whether the job is cancelled now (a conflict on its task is then the cancel, not a lost hold); False
        when the store cannot say."""
        try:
            return self.store.job_state(job_id=job_id) == "cancelled"
        except STORAGE_ERRORS:
            return False

    def _template_of(self, job: JobRecord) -> KernelTemplate | str:
        """The job's template at the job's version, or why this worker lacks it (not registered here,
        another version, its module does not import): logged once per template; the worker then stops
        advertising it and leaves its tasks to the workers that have it (mixed fleets)."""
        key = (job.template, job.template_version)
        if key in self._lacking:
            return self._lacking[key]
        try:
            template = registry.get(job.template)
            if template.version == job.template_version:
                return template
            reason = f"this worker has {job.template}@{template.version}, the job wants @{job.template_version}"
        except (UserInputError, ImportError, AttributeError, TypeError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        log.warning("worker %s cannot run %s@%s (%s); leaving its tasks to other workers", self.id, *key, reason)
        self._lacking[key] = reason
        return reason

    def _give_up(self, task_id: int, reason: str) -> None:
        """Leave a task this worker could not run (its device failed on it); the store fails the task once
        its job's ``max_attempts`` workers gave it up and no live worker is on it or may still take it."""
        task = self._durable(lambda: self.store.fail_attempt(task_id=task_id, worker_id=self.id, reason=reason))
        if task.state == "failed":
            log.error("task %s failed: %s", task_id, task.error)
        else:
            log.info("gave up task %s (%d worker(s) gave it up): %s", task_id, task.attempts, reason)

    def _compile_pool(self, template: KernelTemplate) -> CompilePool | None:
        """The worker's compile pool (kept warm across tasks) when the template compiles slowly."""
        workers = self.options.compile_workers or os.cpu_count() or 1
        if not template.compile_in_parallel or workers <= 1:
            return None
        if self._pool is None:
            self._pool = CompilePool(workers)
        return self._pool

    def _drive(
        self, job: JobRecord, task_id: int, shape: Shape, measurer: Measurer, stop: threading.Event,
        pool: CompilePool | None,
    ) -> StudyRun:
        """The task's study: trials on this task's shared slots, the final round if this worker wins it."""

        opened: list[StudyContext] = []

        def on_open(ctx: StudyContext) -> None:
            opened.append(ctx)
            self._heartbeat.attach(ctx.storage, ctx.in_flight)
            self.store.attach_study(task_id=task_id, study_id=ctx.study_id)

        def job_active() -> bool:
            return self._job_active(job.id)

        def may_publish() -> bool:  # and the store checks, with the publish, that the round is still this worker's
            return not self._lost.is_set() and job_active()

        def should_stop() -> bool:
            return stop.is_set() or self._lost.is_set() or not job_active()

        def take_final_round() -> bool:  # False: trials still running elsewhere, or another worker finalises
            if self.store.begin_finalize(task_id=task_id, worker_id=self.id):
                return True
            # Trials were left but the search has nothing new: a sampler of a finite list (grid, exhaustive)
            # handed out every point, or another (TPE, random) proposed only known or invalid configs for a
            # run of asks while no config waits in the study's queue (a queued one is new). Fewer valid
            # configs than trials: close the search at what is reserved (the trials in flight on other workers
            # are still told; the last of them takes the final round), or the task would stay claimable and
            # every claim would end here again.
            ctx = opened[0] if opened else None
            if ctx is None or not (exhausted(ctx.sampler, ctx.study)
                                   or (ctx.stalled and not optuna_access.waiting_trials(ctx.study))):
                return False
            return self.store.end_search(task_id=task_id) and self.store.begin_finalize(task_id=task_id,
                                                                                         worker_id=self.id)

        options = StudyOptions(sampler=job.sampler, seed=job.seed, finalists=job.finalists,
                               comparators=job.comparators, heartbeat_s=self.options.heartbeat_s,
                               device_index=self.device_index)
        return run_study(job.template, shape, store=self.store, measurer=measurer,
                         budget=SlotBudget(self.store, task_id, self.id), options=options, pool=pool,
                         on_open=on_open, should_stop=should_stop, take_final_round=take_final_round,
                         persist=self._durable, may_publish=may_publish, hold=RoundHold(task_id, self.id))

    def _finish(self, run: StudyRun, task_id: int) -> None:
        final = run.final
        assert final is not None
        winner = final.winner.result if final.winner else None
        self._durable(lambda: self.store.finish_task(
            task_id=task_id, worker_id=self.id,
            best_us=winner.median_us if winner else None,
            best_config_json=winner.config.to_json() if winner else None,
            error=None if winner else _no_winner(final),
        ))

    def _verify(self, job: JobRecord, task_id: int, shape: Shape) -> None:
        """A verify job's task: re-measure the shape's published best in fresh processes (one worker takes
        it, through ``begin_finalize``) and record the verification; the task keeps the re-measured median
        and the verification (what the job page and ``GET /v1/jobs/{id}`` show it found). A drift is a
        finding, not a failure; so is a wrong result on another device name than the study's (a foreign best,
        re-verified for this device: flagged in the verification, logged, the best left as it is). The task
        fails when the verification disproved the best (wrong results on the study's own device name: its
        error says what was published instead), or when no process measured the best OK and none found it
        wrong. A stand-in published after a disproval is verified in turn, as ``tuner verify`` does
        (:func:`tuner.driver.reverify.verify_served`, up to ``options.stand_ins``; not once the worker stops
        or the job ends): the task then keeps the last verification made and its error says what each found,
        and what was left unverified. A failure verifying a stand-in fails the task with the disproval's text
        (a DeviceError still gives the task up)."""
        if not self.store.begin_finalize(task_id=task_id, worker_id=self.id):
            return  # another worker took it
        chain: list[Verification] = []
        cut = "the stand-in limit was reached"  # why a stand-in published by the last verification is unverified
        try:
            for found, verified_next in verify_served(
                self.store, job.template, shape, stand_ins=self.options.stand_ins, device=self.options.device,
                processes=job.processes or 1,
                options=MeasureOptions(n_samples=job.samples, timeout_s=job.candidate_timeout_s),
                comparators=job.comparators, comparator_processes=job.comparator_processes, worker=self.id,
            ):
                chain.append(found)
                if verified_next and (self._stop.is_set() or self._lost.is_set() or not self._job_active(job.id)):
                    cut = "the worker stopped or the job ended first"
                    break
        except TunerError as exc:
            # Nothing found yet, or the device failed: as any task (_serve). After a disproval, the task says
            # so rather than leaving the stand-in to a worker that would find it right and end the job done.
            if isinstance(exc, DeviceError) or not any(o.disproved for o in chain):
                raise
            log.warning("verify task %s of job %s: verifying the stand-in: %s", task_id, job.id, exc)
            cut = f"its verification failed: {type(exc).__name__}: {exc}"
        outcome = chain[-1]  # the last verification made: of what is served now unless a stand-in was left
        median = outcome.verdict.median_us
        error = None if median is not None else "the published best did not measure OK in any process"
        disproved = [disproval_text(o) for o in chain if o.disproved]
        if disproved:
            error = "; then ".join(disproved)
            if not outcome.disproved:
                error += f"; then {verdict_text(outcome)}"
            elif outcome.replacement is not None:
                error += f" (not verified: {cut})"
        elif outcome.verdict.wrong:  # flagged, not failed: the store keeps no text with a task that is done
            error = None
            log.warning("verify task %s of job %s: %s", task_id, job.id, disproval_text(outcome))
        self._durable(lambda: self.store.finish_task(
            task_id=task_id, worker_id=self.id, best_us=median, best_config_json=outcome.best.config_json,
            error=error, verification_id=outcome.record.id,  # what it found: the job page and its JSON show it
        ))

    def _leave(self) -> None:
        try:
            self.store.stop_worker(worker_id=self.id)
        except STORAGE_ERRORS as exc:  # its lease lapses: the reaper gives back what it held
            log.error("could not deregister worker %s: %s", self.id, exc)


def advertised_templates() -> dict[str, str]:
    """The templates this process has, name → version, read from the registry's specs (torch-free for the
    built-in ones); a template whose spec does not load is not advertised."""
    have: dict[str, str] = {}
    for name in registry.names():
        try:
            have[name] = registry.spec(name).version
        except Exception as exc:  # any import failure: this worker does not have it
            log.warning("template %s not advertised: %s: %s", name, type(exc).__name__, exc)
    return have


def parse_backends(text: str) -> tuple[str, ...]:
    """``"triton,tilelang"`` → a tuple; UserInputError for an unknown backend."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise UserInputError(f"unknown backend(s) {', '.join(unknown) or '(none)'}; known: {', '.join(BACKENDS)}")
    return names


__all__ = ["BACKENDS", "SlotBudget", "Worker", "WorkerOptions", "advertised_templates", "parse_backends"]

