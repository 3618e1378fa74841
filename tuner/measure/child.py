"""The measurement worker: a subprocess that builds, verifies and times candidates on one device.

Started by :class:`tuner.measure.measurer.Measurer` as ``python -m tuner.measure.child <reply-fd> <kind> <index>``
(see :mod:`tuner.measure.pool`). It opens the device backend, answers :class:`Ready`, then serves requests until its
stdin closes. A request's candidates are built and verified one after the other, each reported as soon as
it is done (so that the parent knows which candidate was running if this process dies), then the verified
ones are timed together, interleaved, in one ``backend.time`` call.

Per candidate: build (exception → COMPILE_ERROR); for each check seed, fresh inputs, reference, outputs
poisoned, one run (exception at the first launch → COMPILE_ERROR if the template calls it a compile error,
else RUNTIME_ERROR), comparison (→ WRONG_RESULT); then, with ``near_bound`` in the options, a candidate whose
worst error came near its bound is checked the same way on more input sets (none with ``extra_seeds`` 0), and a
config whose worst error over every set checked is short of the option's headroom under a bound is
WRONG_RESULT (a trial's single set: ``TRIAL_NEAR_BOUND``; a final round's: ``FINAL_NEAR_BOUND``). Errors of
the template itself (it does not import, its inputs or reference raise) are not candidate failures: the
request answers :class:`Failed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import errors, registry
from tuner.errors import DeviceError, MeasureSetupError
from tuner.frozen import Config, Shape
from tuner.measure.devices.base import DeviceBackend, DeviceKind
from tuner.measure.devices.kinds import backend_class
from tuner.measure.pool import read_frame, write_frame
from tuner.measure.protocol import (
    Candidate,
    Done,
    Failed,
    FingerprintReply,
    FingerprintRequest,
    Loaded,
    MeasureOptions,
    MeasureRequest,
    Prepared,
    Ready,
    TimingStarted,
)
from tuner.measure.verify import Verdict, check_outputs, poison_
from tuner.results import MeasureResult, PhaseTimes, SampleSummary, Status
from tuner.template import Comparator, Kernel, KernelTemplate

if TYPE_CHECKING:
    import torch

Reply = Ready | Loaded | Prepared | TimingStarted | Done | FingerprintReply | Failed


@dataclass
class Runnable:
    """A built and verified candidate, ready to be timed (holds its inputs and outputs)."""

    config: Config
    kernel: Kernel
    inputs: Mapping[str, torch.Tensor]
    outputs: Mapping[str, torch.Tensor]
    errors: Mapping[str, float]
    build_s: float
    verify_s: float


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    reply_fd, kind, index = int(args[0]), args[1], int(args[2])
    faulthandler.enable()  # a segfault prints the Python stack to the log the parent reads
    try:
        backend = open_backend(kind, index)  # type: ignore[arg-type]
    except Exception as exc:
        write_frame(reply_fd, failed(exc, DeviceError))
        return 1
    import torch  # noqa: F401  (every template needs it: import it before the first request, not during)

    write_frame(reply_fd, Ready(os.getpid()))
    while (request := read_frame(sys.stdin.buffer)) is not None:
        for reply in handle(backend, request):
            write_frame(reply_fd, reply)
    return 0


def open_backend(kind: DeviceKind, index: int) -> DeviceBackend:
    if kind == "cuda":
        from tuner.measure.devices.cuda import backend_from_env

        return backend_from_env(index)
    return backend_class(kind)(index)


def handle(backend: DeviceBackend, request: object) -> Iterator[Reply]:
    """The replies to one request; failures outside candidates become one :class:`Failed` reply."""
    try:
        if isinstance(request, FingerprintRequest):
            yield FingerprintReply(backend.fingerprint().to_json())
        elif isinstance(request, MeasureRequest):
            yield from measure(backend, request)
        else:
            yield Failed("MeasureSetupError", f"unknown request {type(request).__name__}")
    except Exception as exc:
        yield failed(exc, MeasureSetupError)


def failed(exc: BaseException, default: type[errors.TunerError]) -> Failed:
    """A Failed reply naming the exception's class if it is one of tuner.errors (with its message), else
    ``default`` (with a description of the unexpected exception)."""
    name = type(exc).__name__
    if isinstance(exc, errors.TunerError) and getattr(errors, name, None) is type(exc):
        return Failed(name, str(exc))
    return Failed(default.__name__, describe(exc))


def measure(backend: DeviceBackend, request: MeasureRequest) -> Iterator[Reply]:
    try:
        template = registry.load(request.template_ref)
    except Exception as exc:
        raise MeasureSetupError(f"cannot load template {request.template_ref}: {describe(exc)}") from exc
    shape = Shape.from_json(request.shape_json)
    yield Loaded()
    ready: list[tuple[int, Runnable]] = []
    failures: list[MeasureResult] = []
    for position, wire in enumerate(request.candidates):
        outcome = prepare(template, shape, wire.candidate(), backend, request.seed, request.options)
        if isinstance(outcome, MeasureResult):
            failures.append(outcome)
            yield Prepared(position, outcome)
        else:
            ready.append((position, outcome))
            yield Prepared(position, None)
    timed = Timed([], [], False)
    if ready:
        yield TimingStarted(tuple(position for position, _ in ready))
        timed = time_together(backend, ready, request.options)
    crashed = bool(timed.retry) or any(
        r.status is Status.RUNTIME_ERROR for r in [*failures, *(r for _, r in timed.results)]
    )
    # A runtime error on a device may leave its context corrupt (sticky CUDA errors): start afresh.
    restart = crashed and backend.kind != "cpu"
    yield Done(tuple(timed.results), tuple(timed.retry), split=timed.split, restart=restart)


def prepare(
    template: KernelTemplate,
    shape: Shape,
    candidate: Candidate,
    backend: DeviceBackend,
    seed: int,
    options: MeasureOptions,
) -> Runnable | MeasureResult:
    """Build and verify one candidate; a MeasureResult when it fails, else a Runnable. A comparator whose
    contract differs from the template's is built, checked and timed on its contract's shape. A gated
    candidate near its bounds on the ``check_seeds`` sets is checked on more (``options.near_bound``), and fails
    when its worst error over every set checked leaves less than that option's headroom under a bound."""
    config = candidate.result_config()
    if candidate.comparator is not None:
        shape = _comparator(template, candidate.comparator).contract_shape(shape)
    start = time.perf_counter()
    kernel = build(template, shape, candidate, config)
    build_s = time.perf_counter() - start
    if isinstance(kernel, MeasureResult):
        return dataclasses.replace(kernel, phases=PhaseTimes(build_s=build_s))
    checks = _Checks(template, shape, candidate, kernel, backend, build_s)
    failure = checks.on(range(seed, seed + options.check_seeds))
    extra = options.near_bound
    if failure is None and extra is not None and checks.gated:
        bounds = template.error_bounds(shape)
        if extra.near(checks.worst, bounds):
            first = seed + options.check_seeds
            failure = checks.on(range(first, first + extra.extra_seeds))
        # the headroom is asked of what a round may publish: configs, not comparators
        short = None if failure is not None or candidate.comparator is not None else extra.why_short(
            checks.worst, bounds)
        if short is not None:
            sets = f"seeds {seed}-{seed + checks.runs - 1}" if checks.runs > 1 else f"seed {seed}"
            failure = MeasureResult(
                Status.WRONG_RESULT, config, errors=dict(checks.worst), timer=backend.timer, phases=checks.phases(),
                reason=f"inputs {sets}: {short} (a config at its bound on these inputs fails on others)")
    if failure is not None:
        return failure
    assert checks.case is not None  # check_seeds >= 1
    return Runnable(config, kernel, checks.case[0], checks.case[1], checks.worst, checks.build_s, checks.verify_s)


class _Checks:
    """The correctness checks of one built candidate, over as many input sets as it is given: the worst error
    of each output over every set checked, the phase times, and the last set's inputs and outputs."""

    def __init__(self, template: KernelTemplate, shape: Shape, candidate: Candidate, kernel: Kernel,
                 backend: DeviceBackend, build_s: float) -> None:
        self.template, self.shape, self.candidate, self.kernel, self.backend = (
            template, shape, candidate, kernel, backend)
        self.gated = _gated(template, candidate)
        self.build_s, self.verify_s = build_s, 0.0
        self.runs = 0
        self.worst: dict[str, float] = {}
        self.case: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None

    def on(self, seeds: Iterable[int]) -> MeasureResult | None:
        """Check the candidate on fresh inputs from each seed in turn; its failure (with the worst errors so
        far) at the first set that fails it, else None. The first run of all counts as build time (backends
        that compile lazily compile there)."""
        config = self.candidate.result_config()
        for s in seeds:
            first = self.runs == 0
            self.runs += 1
            start = time.perf_counter()
            inputs, reference, outputs = fresh_case(self.template, self.shape, self.backend, s)
            self.verify_s += time.perf_counter() - start
            start = time.perf_counter()
            produced = run_once(self.template, self.kernel, inputs, outputs, self.backend, first=first)
            if first:
                self.build_s += time.perf_counter() - start
            else:
                self.verify_s += time.perf_counter() - start
            if isinstance(produced, tuple):
                status, reason = produced
                return MeasureResult(status, config, errors=dict(self.worst), reason=reason,
                                     timer=self.backend.timer, phases=self.phases())
            start = time.perf_counter()
            verdict = compare(self.template, self.shape, produced, reference)
            self.verify_s += time.perf_counter() - start
            for name, error in verdict.errors.items():
                self.worst[name] = max(error, self.worst.get(name, 0.0))
            if verdict.failure is not None and self.gated:
                return MeasureResult(Status.WRONG_RESULT, config, errors=dict(self.worst),
                                     reason=f"inputs seed {s}: {verdict.failure}", timer=self.backend.timer,
                                     phases=self.phases())
            self.case = (inputs, outputs)
        return None

    def phases(self) -> PhaseTimes:
        return PhaseTimes(build_s=self.build_s, verify_s=self.verify_s)


def _gated(template: KernelTemplate, candidate: Candidate) -> bool:
    """Whether a wrong result fails this candidate: always for configs; for comparators unless ungated."""
    if candidate.comparator is None:
        return True
    return all(c.gated for c in template.comparators() if c.name == candidate.comparator)


def build(
    template: KernelTemplate, shape: Shape, candidate: Candidate, config: Config
) -> Kernel | MeasureResult:
    """The kernel of a config or comparator; INVALID if the comparator is unavailable, COMPILE_ERROR if the
    build raises. An unknown comparator name raises MeasureSetupError (a caller error)."""
    builder: Callable[[], Kernel]
    if candidate.comparator is not None:
        comparator = _comparator(template, candidate.comparator)
        try:
            why = comparator.unavailable(shape)
        except Exception as exc:
            why = f"its availability check raised {describe(exc)}"
        if why:
            # INVALID ("rejected before any compile"): it did not run here, which is not a runtime error.
            return MeasureResult(Status.INVALID, config, reason=f"unavailable: {why}")
        builder = lambda: comparator.build(shape)  # noqa: E731
    else:
        assert candidate.config is not None
        builder = lambda: template.build(candidate.config, shape)  # type: ignore[arg-type]  # noqa: E731
    try:
        return builder()
    except Exception as exc:
        return MeasureResult(Status.COMPILE_ERROR, config, reason=describe(exc))


def _comparator(template: KernelTemplate, name: str) -> Comparator:
    """The template's comparator of that name; MeasureSetupError (a caller error) when it has none."""
    comparators = {c.name: c for c in template.comparators()}
    if name not in comparators:
        known = ", ".join(comparators) or "none"
        raise MeasureSetupError(f"{template.name} has no comparator {name!r} (known: {known})")
    return comparators[name]


def fresh_case(
    template: KernelTemplate, shape: Shape, backend: DeviceBackend, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Fresh inputs from ``seed``, their reference, and poisoned outputs. MeasureSetupError if the template
    raises (its bug, not the candidate's)."""
    try:
        inputs = template.make_inputs(shape, backend.torch_device, seed)
        reference = template.reference(shape, inputs)
        outputs = template.allocate_outputs(shape, inputs)
        for spec in template.output_specs(shape):
            poison_(outputs[spec.name], reference[spec.name])
    except Exception as exc:
        raise MeasureSetupError(f"{template.name}: inputs/reference/outputs raised {describe(exc)}") from exc
    return inputs, reference, outputs


def run_once(
    template: KernelTemplate,
    kernel: Kernel,
    inputs: Mapping[str, torch.Tensor],
    outputs: Mapping[str, torch.Tensor],
    backend: DeviceBackend,
    *,
    first: bool,
) -> Mapping[str, torch.Tensor] | tuple[Status, str]:
    """Run the kernel once and wait for the device. Returns the outputs to check (those the kernel returned,
    if it allocates its own as a library wrapper does, else ``outputs``), or the failure status and reason
    if it raised."""
    try:
        returned = kernel(inputs, outputs)
        backend.synchronize()  # asynchronous device errors surface here, still attributed to this run
    except Exception as exc:
        compile_error = first and template.is_compile_error(exc)
        return (Status.COMPILE_ERROR if compile_error else Status.RUNTIME_ERROR), describe(exc)
    return outputs if returned is None else returned


def compare(
    template: KernelTemplate,
    shape: Shape,
    outputs: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
) -> Verdict:
    try:
        return check_outputs(outputs, reference, template.output_specs(shape))
    except ValueError as exc:
        raise MeasureSetupError(f"{template.name}: {exc}") from exc


@dataclass
class Timed:
    """Results of a timing phase by position, and the positions to measure again (one by one if ``split``)."""

    results: list[tuple[int, MeasureResult]]
    retry: list[int]
    split: bool


def time_together(
    backend: DeviceBackend, ready: Sequence[tuple[int, Runnable]], options: MeasureOptions
) -> Timed:
    """Time the verified candidates interleaved. If a candidate raises, it gets RUNTIME_ERROR and the others
    are to be retried; a device fault raised outside the candidates' calls (an asynchronous CUDA error met
    by the flush, say) names no culprit: all are retried one by one. Other failures raise DeviceError."""
    raised: list[int] = []

    def call(position: int, runnable: Runnable) -> Callable[[], None]:
        def run() -> None:
            try:
                runnable.kernel(runnable.inputs, runnable.outputs)
            except BaseException:
                raised.append(position)
                raise

        return run

    start = time.perf_counter()
    try:
        fns = [call(p, r) for p, r in ready]
        timing = backend.time_by_kernel(fns, n_samples=options.n_samples, warmup=options.warmup)
        samples = timing.samples
    except DeviceError:
        raise
    except Exception as exc:
        if not raised and not _is_device_fault(exc):
            raise DeviceError(f"timing failed outside the candidates: {describe(exc)}") from exc
        if not raised and len(ready) > 1:
            return Timed([], [p for p, _ in ready], split=True)
        culprit = raised[-1] if raised else ready[0][0]
        runnable = dict(ready)[culprit]
        result = MeasureResult(Status.RUNTIME_ERROR, runnable.config, errors=runnable.errors,
                               reason=f"raised while timing: {describe(exc)}", timer=backend.timer,
                               phases=PhaseTimes(runnable.build_s, runnable.verify_s,
                                                 time.perf_counter() - start))
        return Timed([(culprit, result)], [p for p, _ in ready if p != culprit], split=False)
    measure_s = (time.perf_counter() - start) / len(ready)
    if len(samples) != len(ready) or any(len(s) != options.n_samples for s in samples):
        raise DeviceError(
            f"{backend.kind} backend returned sample counts {[len(s) for s in samples]} for "
            f"{len(ready)} candidates × {options.n_samples}"
        )
    kernels = timing.kernels if len(timing.kernels) == len(ready) else [{} for _ in ready]
    return Timed(
        [
            (position, MeasureResult(Status.OK, r.config, SampleSummary.of(s), r.errors, None, backend.timer,
                                     PhaseTimes(r.build_s, r.verify_s, measure_s), kernel_medians(k)))
            for (position, r), s, k in zip(ready, samples, kernels, strict=True)
        ],
        [],
        split=False,
    )


MAX_KERNEL_NAMES = 32  # per measurement; the rest are summed under OTHER_KERNELS
OTHER_KERNELS = "(other kernels)"


def kernel_medians(per_sample: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Median µs per sample of each activity name, the longest first; beyond ``MAX_KERNEL_NAMES`` names
    the rest are folded into one ``OTHER_KERNELS`` entry (a candidate launching many distinct kernels)."""
    medians = sorted(((statistics.median(v), k) for k, v in per_sample.items() if v), reverse=True)
    kept = {name: us for us, name in medians[:MAX_KERNEL_NAMES]}
    if len(medians) > MAX_KERNEL_NAMES:
        kept[OTHER_KERNELS] = sum(us for us, _ in medians[MAX_KERNEL_NAMES:])
    return kept


# Messages of errors a kernel leaves on the device, raised by whatever call meets them next.
_DEVICE_FAULT_MARKERS = ("CUDA error", "illegal memory access", "illegal instruction", "misaligned address",
                         "unspecified launch failure", "device-side assert")


def _is_device_fault(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "AcceleratorError" in names or any(marker in str(exc) for marker in _DEVICE_FAULT_MARKERS)


def describe(exc: BaseException, frames: int = 3) -> str:
    """One line naming the exception (and its root cause), then where the root cause was raised."""
    root = exc
    for _ in range(8):
        nxt = root.__cause__ or root.__context__
        if nxt is None:
            break
        root = nxt
    head = _one_line(exc)
    if root is not exc and _one_line(root) not in head:
        head += f" (from {_one_line(root)})"
    where = traceback.extract_tb(root.__traceback__)[-frames:]
    tail = " < ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(where))
    return f"{head}\n  at {tail}" if tail else head


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    line = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _exit(code: int) -> None:
    """End the process now, with ``code``, once its output is flushed: every reply has been written and
    nothing is left to persist, and the interpreter's own teardown waits on whatever a library left behind
    (threads, CUDA and compiler runtimes): on the H200 a `tuner tune` was found waiting out the parent's 5 s
    grace for this process after publishing (2026-12-03)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
