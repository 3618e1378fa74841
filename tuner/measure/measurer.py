"""The Measurer: every candidate is built, verified and timed in an isolated, reusable worker process.

A compile failure, a crash (segfault, abort, illegal memory access), a hang or a wrong result becomes a
:class:`~tuner.results.MeasureResult` with its status and reason, and measuring goes on: the worker is killed
and a fresh one started after a crash, a hang, or a runtime error on a device (whose context may be corrupt).
The parent process never initialises a device; it only resolves the device kind and talks to the worker.

Statuses produced here: OK, COMPILE_ERROR (build raised, or the first launch raised what the template calls a
compile error), RUNTIME_ERROR (a later exception, or the worker died: the reason says how, with the tail of
what it printed), WRONG_RESULT (an output's relative L2 error over its bound; ``errors`` keeps the figures),
TIMEOUT (no answer within ``timeout_s``), INVALID (a comparator unavailable here: reason ``unavailable: …``).
Errors outside any candidate (unknown template or comparator, template inputs that raise, a device backend
failure) raise :class:`~tuner.errors.MeasureSetupError` / :class:`~tuner.errors.DeviceError`.

Phase times of a candidate killed by a crash or timeout: the time until then is counted as ``build_s`` when it
happened while building/verifying, as ``measure_s`` when it happened while timing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tuner import errors, registry
from tuner.errors import MeasureInterrupted, MeasureSetupError
from tuner.frozen import Shape
from tuner.measure.contract import CallTimes
from tuner.measure.devices.base import DeviceSpec, Fingerprint
from tuner.measure.devices.kinds import backend_class, resolve
from tuner.measure.pool import WorkerDied, WorkerProcess, WorkerTimedOut
from tuner.measure.protocol import (
    Candidate,
    Done,
    Failed,
    FingerprintReply,
    FingerprintRequest,
    Loaded,
    MeasureOptions,
    MeasureRequest,
    NearBoundChecks,
    Prepared,
    Ready,
    TimingStarted,
    WireCandidate,
)
from tuner.results import MeasureResult, PhaseTimes, Status

__all__ = ["Candidate", "MeasureOptions", "Measurer", "NearBoundChecks"]

WORKER_MODULE = "tuner.measure.child"
STARTUP_TIMEOUT_S = 300.0  # importing torch and opening a device on a loaded host can take a while
FINGERPRINT_TIMEOUT_S = 300.0

_R = TypeVar("_R")


@dataclass
class _Round:
    """The outcome of one request to the worker: results by candidate index, and what to measure again."""

    results: dict[int, MeasureResult] = field(default_factory=dict)
    retry: list[int] = field(default_factory=list)
    split: bool = False  # retry one by one: a crash while timing several candidates names no culprit


@dataclass
class _Clock:
    """The parts of one call's time, added up as its requests run (:class:`CallTimes`)."""

    start_s: float = 0.0
    load_s: float = 0.0
    prepare_s: float = 0.0
    timing_s: float = 0.0
    requests: int = 0


class Measurer:
    """Measures template candidates on one device through a warm worker process.

    Thread-safe: calls are serialised (one device measures one thing at a time). Use as a context manager,
    or call :meth:`close`. ``template_ref`` arguments are ``module:Class`` import paths or registered names.
    """

    def __init__(self, device: DeviceSpec | None = None, options: MeasureOptions | None = None) -> None:
        self.device = resolve(device or DeviceSpec())
        self.options = options or MeasureOptions()
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._ready = False
        self._fingerprint: Fingerprint | None = None
        self._closed = False
        self._interrupted = False
        self._clock = _Clock()  # the call in progress (calls hold the lock)
        self._timing_from: float | None = None  # when the request in progress began timing
        self._last = threading.local()  # each thread's last call's CallTimes
        self._start_worker()  # start now: its imports overlap the caller's own set-up

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API ---------------------------------------------------------------------------------
    def fingerprint(self) -> Fingerprint:
        """The device fingerprint, asked of the worker once and cached."""
        with self._lock:
            if self._fingerprint is None:
                worker = self._ready_worker()
                worker.send(FingerprintRequest())
                timeout_s = max(FINGERPRINT_TIMEOUT_S, self.options.timeout_s)
                reply = self._expect(worker, FingerprintReply, timeout_s, "taking the fingerprint")
                self._fingerprint = Fingerprint.from_json(reply.fingerprint_json)
            return self._fingerprint

    def measure(
        self, template_ref: str, shape: Shape, candidate: Candidate, *, seed: int | None = None,
        near_bound: NearBoundChecks | None = None,
    ) -> MeasureResult:
        """Build, verify and time one candidate on fresh inputs from ``seed`` (default: options.seed);
        ``near_bound``: as :meth:`measure_interleaved`."""
        return self.measure_interleaved(template_ref, shape, [candidate], seed=seed, near_bound=near_bound)[0]

    def measure_interleaved(
        self, template_ref: str, shape: Shape, candidates: Sequence[Candidate], *, seed: int | None = None,
        check_seeds: int | None = None, near_bound: NearBoundChecks | None = None,
    ) -> list[MeasureResult]:
        """Build and verify each candidate, then time the verified ones together, one sample of each per
        round, so that their figures come from the same run. One result per candidate, in order; a failing
        candidate never loses the others' results (they are measured again without it if it kills the
        worker). ``check_seeds``: verify on that many input sets this call; ``near_bound``: check a candidate
        near its error bounds on more (:class:`~tuner.measure.protocol.NearBoundChecks`); None: the options'."""
        self._last.times = None  # until this call ends well
        if not candidates:
            return []
        ref = template_ref if ":" in template_ref else registry.ref_of(template_ref)
        chosen_seed = self.options.seed if seed is None else seed
        results: dict[int, MeasureResult] = {}
        with self._lock:
            started, self._clock = time.monotonic(), _Clock()
            options = self.options
            if check_seeds is not None:
                options = dataclasses.replace(options, check_seeds=check_seeds)
            if near_bound is not None:
                options = dataclasses.replace(options, near_bound=near_bound)
            groups = [list(range(len(candidates)))]
            while groups:
                group = groups.pop(0)
                outcome = self._run_round(ref, shape, candidates, group, chosen_seed, options)
                if self._interrupted:  # its results are the kill's, not the candidates'
                    raise MeasureInterrupted("the measurement was interrupted")
                results.update(outcome.results)
                if outcome.retry:
                    groups.extend([[i] for i in outcome.retry] if outcome.split else [outcome.retry])
            self._last.times = CallTimes(time.monotonic() - started, **dataclasses.asdict(self._clock))
        return [dataclasses.replace(results[i], config=c.result_config()) for i, c in enumerate(candidates)]

    def last_call_times(self) -> CallTimes | None:
        """Where the calling thread's last :meth:`measure_interleaved` (or :meth:`measure`) call spent its
        time; None before one or after one that raised."""
        return getattr(self._last, "times", None)

    def set_options(self, options: MeasureOptions) -> None:
        """Use these options from the next call on (a worker serving jobs with other sample counts)."""
        with self._lock:
            self.options = options

    def interrupt(self) -> None:
        """End the measurement in progress now, from any thread (a worker told to stop by SIGTERM): its
        process is killed, the call measuring raises MeasureInterrupted (its candidates get no result, to be
        measured again later), and no fresh process is started. Later calls raise MeasureInterrupted too.
        Does not wait for the measuring thread; idempotent."""
        self._interrupted = True
        worker = self._worker
        if worker is not None:
            worker.terminate_group()

    def close(self) -> None:
        """Stop the worker. Idempotent; the measurer cannot be used afterwards."""
        with self._lock:
            self._closed = True
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    # -- worker lifecycle ---------------------------------------------------------------------------
    def _start_worker(self) -> None:
        kind, index = self.device.kind, self.device.index
        env = dict(os.environ)
        env.update(backend_class(kind).subprocess_env(index))  # type: ignore[arg-type]
        env["PYTHONPATH"] = _child_pythonpath(env.get("PYTHONPATH", ""))
        self._worker = WorkerProcess(WORKER_MODULE, [kind, str(index)], env)
        self._ready = False
        self._rounds = 0  # requests the current worker has started (0: a fresh process)

    def _discard_worker(self, restart: bool = True) -> None:
        """Kill the worker; if ``restart``, start a fresh one now, so that the next call finds it warm."""
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        if restart and not (self._closed or self._interrupted):
            self._start_worker()

    def _ready_worker(self) -> WorkerProcess:
        if self._interrupted:
            raise MeasureInterrupted("the measurer was interrupted")
        if self._closed:
            raise MeasureSetupError("this measurer is closed")
        if self._worker is None or (self._ready and not self._worker.alive()):
            self._discard_worker()
        worker = self._worker
        assert worker is not None
        if not self._ready:
            waited = time.monotonic()
            try:
                self._expect(worker, Ready, STARTUP_TIMEOUT_S, "starting")
            except errors.TunerError:
                self._discard_worker(restart=False)  # the next call tries a fresh one
                raise
            finally:
                self._clock.start_s += time.monotonic() - waited
            self._ready = True
        return worker

    def _expect(self, worker: WorkerProcess, kind: type[_R], timeout_s: float, what: str) -> _R:
        """The worker's next reply, which must be a ``kind``. A Failed reply raises its error (the worker is
        fine); a dead, silent or confused worker is replaced and MeasureSetupError raised."""
        try:
            reply = worker.receive(timeout_s)
        except (WorkerDied, WorkerTimedOut) as exc:
            self._discard_worker()
            raise MeasureSetupError(f"the measurement worker failed while {what}: {exc}") from None
        if isinstance(reply, Failed):
            raise _error_of(reply)
        if not isinstance(reply, kind):
            self._discard_worker()
            raise MeasureSetupError(f"unexpected reply from the measurement worker while {what}: {reply!r}")
        return reply

    # -- one request --------------------------------------------------------------------------------
    def _run_round(
        self, ref: str, shape: Shape, candidates: Sequence[Candidate], group: list[int], seed: int,
        options: MeasureOptions,
    ) -> _Round:
        request = MeasureRequest(
            ref, shape.to_json(), tuple(WireCandidate.of(candidates[i]) for i in group), seed, options
        )
        worker = self._ready_worker()
        worker.clear_log()
        try:
            worker.send(request)
        except WorkerDied:  # it died while idle: not the fault of this request's candidates
            self._discard_worker()
            worker = self._ready_worker()
            worker.send(request)
        self._rounds += 1
        self._clock.requests += 1
        seasoned = self._rounds > 1
        try:
            return self._follow(worker, candidates, group)
        except MeasureSetupError:
            # Inputs or the reference failed to set up. On a device, an earlier candidate's asynchronous
            # fault (an illegal address) poisons the context for whatever runs next: that is not the
            # template's fault. Retry on a fresh process, one candidate at a time; raise only when the
            # setup also fails there, alone.
            self._discard_worker()
            if self.device.kind == "cpu" or not (seasoned or len(group) > 1):
                raise
            return _Round(retry=list(group), split=True)

    def _follow(self, worker: WorkerProcess, candidates: Sequence[Candidate], group: list[int]) -> _Round:
        """Read the worker's replies to one request until it is done, dies or runs out of time."""
        # Importing the template is not charged to the candidates' timeouts.
        asked = time.monotonic()
        try:
            self._expect(worker, Loaded, STARTUP_TIMEOUT_S, "loading the template")
        finally:
            self._clock.load_s += time.monotonic() - asked
        timeout_s = self.options.timeout_s
        start = time.monotonic()
        self._timing_from = None  # set when the process says the timing started
        try:
            return self._replies(worker, candidates, group, timeout_s, start)
        finally:
            self._clock.prepare_s += (self._timing_from or time.monotonic()) - start
            if self._timing_from is not None:
                self._clock.timing_s += time.monotonic() - self._timing_from

    def _replies(
        self, worker: WorkerProcess, candidates: Sequence[Candidate], group: list[int], timeout_s: float,
        start: float,
    ) -> _Round:
        stage_start = start
        budget_end = start + timeout_s * len(group)
        outcome = _Round()
        verified: list[int] = []  # positions in group
        current = 0  # position being built and verified
        timing = False
        while True:
            deadline = budget_end if timing else min(budget_end, stage_start + timeout_s)
            try:
                reply = worker.receive(deadline - time.monotonic())
            except (WorkerDied, WorkerTimedOut) as exc:
                self._discard_worker()
                elapsed = time.monotonic() - stage_start
                return self._after_loss(exc, outcome, candidates, group, verified, current, timing, elapsed)
            if isinstance(reply, Prepared):
                if reply.failure is not None:
                    outcome.results[group[reply.position]] = reply.failure
                else:
                    verified.append(reply.position)
                current = reply.position + 1
                stage_start = time.monotonic()
            elif isinstance(reply, TimingStarted):
                timing = True
                self._timing_from = time.monotonic()
            elif isinstance(reply, Done):
                outcome.results.update((group[p], r) for p, r in reply.results)
                outcome.retry = [group[p] for p in reply.retry]
                outcome.split = reply.split
                if reply.restart:
                    self._discard_worker()
                return outcome
            elif isinstance(reply, Failed):
                raise _error_of(reply)
            else:
                self._discard_worker()
                raise MeasureSetupError(f"unexpected reply from the measurement worker: {reply!r}")

    def _after_loss(
        self,
        exc: WorkerDied | WorkerTimedOut,
        outcome: _Round,
        candidates: Sequence[Candidate],
        group: list[int],
        verified: list[int],
        current: int,
        timing: bool,
        elapsed: float,
    ) -> _Round:
        """Results after the worker died or hung: blame the candidate that was running, retry the others."""
        status = Status.TIMEOUT if isinstance(exc, WorkerTimedOut) else Status.RUNTIME_ERROR
        if not timing:
            culprit = group[current]
            what = "building or verifying it"
            phases = PhaseTimes(build_s=elapsed)
            outcome.retry = [group[p] for p in verified] + group[current + 1 :]
        elif len(verified) == 1:
            culprit = group[verified[0]]
            what = "timing it"
            phases = PhaseTimes(measure_s=elapsed)
        else:  # several were being timed together: measure them one by one to find the culprit
            outcome.retry, outcome.split = [group[p] for p in verified], True
            return outcome
        if isinstance(exc, WorkerTimedOut):
            reason = f"no result within {self.options.timeout_s:g} s while {what}"
        else:
            reason = f"the worker process {exc.how} while {what}"
            if exc.output:
                reason += f"; its last output:\n{exc.output}"
        config = candidates[culprit].result_config()
        outcome.results[culprit] = MeasureResult(status, config, reason=reason, phases=phases)
        return outcome


def _error_of(reply: Failed) -> errors.TunerError:
    cls = getattr(errors, reply.error, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.TunerError)):
        cls = MeasureSetupError
    return cls(reply.message)


def _child_pythonpath(existing: str) -> str:
    """The parent's import path for the worker, so that templates registered by import path (tests, plugins)
    import there too."""
    entries = [p or os.getcwd() for p in sys.path] + [p for p in existing.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(entries))
