"""What a measurement produces: a status, a samples summary, per-output errors, phase timings.

Failures of a candidate are values of :class:`MeasureResult`, never exceptions, so that a sweep goes on
and every failure is stored with its reason.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tuner.frozen import Config

# The candidate labels of measurements: a final round times the tuned config, the default, and comparators.
DEFAULT_LABEL = "default"
CONFIG_LABEL = "config"
COMPARATOR_PREFIX = "comparator:"
# The one key of a comparator's result config ({"comparator": name}); no search space may name a parameter so.
COMPARATOR_KEY = "comparator"
T = TypeVar("T")


def reason_line(reason: str | None, limit: int = 120) -> str:
    """A failure's reason for a table cell: its first non-blank line, at most ``limit`` characters, ending in '…'
    when cut (a name cut short reads as cut, not as another name); '' for none."""
    text = (reason or "").strip()
    if not text:
        return ""
    line = text.splitlines()[0].rstrip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def merge_unmeasured_comparators(
    rows: Sequence[T], *, label: Callable[[T], str], status: Callable[[T], str], reason: Callable[[T], str | None],
) -> list[tuple[T, list[str]]]:
    """Rows of a table in order, each with the labels it stands for: comparators that did not measure (status
    not OK) with the same status and reason are one row, at the first one's place (a host without mamba_ssm
    has twelve of its comparators unavailable for one reason: one row, not twelve). Other rows stand alone."""
    out: list[tuple[T, list[str]]] = []
    merged: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        name = label(row)
        if not name.startswith(COMPARATOR_PREFIX) or status(row) == Status.OK.value:
            out.append((row, [name]))
            continue
        key = (status(row), reason(row) or "")
        if key in merged:
            merged[key].append(name)
        else:
            merged[key] = [name]
            out.append((row, merged[key]))
    return out


def merged_label(labels: Sequence[str], *, names: bool = True) -> str:
    """The candidate cell of a merged row: its one label, else '12 comparators: a, b, …' (the comparators' names,
    or without ``names`` just '12 comparators', for a table that lists them in another cell)."""
    if len(labels) == 1:
        return labels[0]
    return f"{len(labels)} comparators" + (f": {comparator_names(labels)}" if names else "")


def comparator_names(labels: Sequence[str]) -> str:
    """'a, b, …': comparator labels without their prefix."""
    return ", ".join(n.removeprefix(COMPARATOR_PREFIX) for n in labels)


class Status(str, enum.Enum):
    """Outcome of one candidate. Only ``OK`` results carry timings that may be published."""

    OK = "OK"
    INVALID = "INVALID"  # rejected by a constraint before any compile
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"  # exception, crash, abort, illegal address
    WRONG_RESULT = "WRONG_RESULT"  # ran, but an output is off the reference by more than its bound
    TIMEOUT = "TIMEOUT"

    def __str__(self) -> str:
        return self.value


# Reason prefix of a replayed trial whose config the record lacks (tuner.measure.devices.replay): an INVALID
# outcome of the measurer, not a rejection by the search space.
NOT_RECORDED = "not recorded"


def is_space_rejection(status: Status | str, reason: str | None) -> bool:
    """Whether a stored trial outcome (``status``: a Status, or any trial status label such as DUPLICATE) is
    the search space's rejection of its config (INVALID, judged by the space's constraints before anything
    was built), as opposed to a measurement. Such a row says nothing about the config once a looser version
    of the space admits it: sweeps, exhaustive plans and warm starts then treat the config as not yet
    measured. The replay device's INVALID for a config its record lacks is the measurer's answer, not a
    rejection."""
    return str(status) == Status.INVALID.value and not (reason or "").startswith(NOT_RECORDED)


class Timer(str, enum.Enum):
    """How the samples were taken; reports print it beside every figure."""

    CUPTI = "cupti"  # device time of the candidate's kernels from the CUDA profiler
    CUDA_EVENTS = "cuda-events"  # declared fallback: includes launch gaps
    NPU_PROFILER = "npu-profiler"
    CPU_WALL = "cpu-wall"  # CPU backend (Triton interpreter, TileLang C target): not device time

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SampleSummary:
    """Summary of N timing samples, in microseconds."""

    median_us: float
    p20_us: float
    p80_us: float
    mean_us: float
    min_us: float
    max_us: float
    n: int

    @classmethod
    def of(cls, samples_us: Sequence[float]) -> SampleSummary:
        """Summarise samples; raises ValueError on an empty sequence."""
        if not samples_us:
            raise ValueError("no samples")
        ordered = sorted(samples_us)
        return cls(
            median_us=statistics.median(ordered),
            p20_us=_quantile(ordered, 0.2),
            p80_us=_quantile(ordered, 0.8),
            mean_us=statistics.fmean(ordered),
            min_us=ordered[0],
            max_us=ordered[-1],
            n=len(ordered),
        )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted data (numpy's default method)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class PhaseTimes:
    """Wall seconds spent per phase of one measurement (for overhead accounting)."""

    build_s: float = 0.0  # build + compile (first launch included where the backend compiles lazily)
    verify_s: float = 0.0  # inputs, reference, poisoned run, comparison
    measure_s: float = 0.0  # warm-up and timed samples


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate (a template config, or a comparator) on one shape.

    Immutable. ``summary`` is set only when ``status`` is OK; ``errors`` holds the relative L2 error of
    every output that was compared (also for WRONG_RESULT, so the figure is kept); ``reason`` is a short
    human-readable cause for every status but OK; ``kernels`` (OK results of backends that see the device's
    activities: CUPTI) the median per sample of each kernel's (memcpy's, memset's) summed duration.
    """

    status: Status
    config: Config
    summary: SampleSummary | None = None
    errors: Mapping[str, float] = field(default_factory=dict)
    reason: str | None = None
    timer: Timer | None = None
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    kernels: Mapping[str, float] = field(default_factory=dict)  # device activity name -> median µs per sample

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def median_us(self) -> float | None:
        return self.summary.median_us if self.summary else None

    def failed(self, status: Status, reason: str) -> MeasureResult:
        """A copy turned into a failure, keeping errors and phase timings."""
        return MeasureResult(status, self.config, None, self.errors, reason, self.timer, self.phases)

