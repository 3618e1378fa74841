"""The measuring contract the driver depends on.

Implemented by :class:`tuner.measure.measurer.Measurer` (candidates built, verified and timed in a subprocess
on a real device) and :class:`tuner.measure.devices.replay.ReplayMeasurer` (answers from a recorded store).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tuner.frozen import Shape
from tuner.measure.devices.base import Fingerprint
from tuner.measure.protocol import Candidate, MeasureOptions, NearBoundChecks
from tuner.results import MeasureResult


@dataclass(frozen=True)
class CallTimes:
    """Where one ``measure_interleaved`` call's wall time went, in seconds, as the calling process saw it.
    Immutable. The parts need not add up to ``total_s``: the rest (``other_s``) is the requests' sending and
    the results' decoding, and a candidate measured again after a lost process counts in each part twice."""

    total_s: float
    start_s: float = 0.0  # waiting for a measuring process to be ready (a fresh one: imports, device set-up)
    load_s: float = 0.0  # the process loading the template, before its first candidate
    prepare_s: float = 0.0  # the candidates' builds and checks, one after another
    timing_s: float = 0.0  # the verified candidates timed together
    requests: int = 0  # more than one: a lost process or a failed set-up made the call measure again

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.start_s - self.load_s - self.prepare_s - self.timing_s)

    def describe(self) -> str:
        """One line, e.g. ``process start 0.0 s, template 0.1 s, builds and checks 20.3 s, timing 9.7 s, other
        0.2 s``."""
        text = (f"process start {self.start_s:.1f} s, template {self.load_s:.1f} s, builds and checks "
                f"{self.prepare_s:.1f} s, timing {self.timing_s:.1f} s, other {self.other_s:.1f} s")
        return text + (f" ({self.requests} requests)" if self.requests > 1 else "")


class Measuring(Protocol):
    """Measures candidates of a template on one device. Implementations are thread-safe.

    Candidate failures are results (a status and a reason), never exceptions; errors outside any candidate
    raise :class:`tuner.errors.MeasureSetupError` or :class:`tuner.errors.DeviceError`.
    """

    @property
    def options(self) -> MeasureOptions:
        """The options of the next call (samples, timeout per candidate, seed). Immutable."""
        ...

    def fingerprint(self) -> Fingerprint:
        """The device fingerprint the measurements are keyed by."""
        ...

    def measure(
        self, template_ref: str, shape: Shape, candidate: Candidate, *, seed: int | None = None,
        near_bound: NearBoundChecks | None = None,
    ) -> MeasureResult:
        """One candidate on fresh inputs from ``seed`` (``near_bound``: as :meth:`measure_interleaved`)."""
        ...

    def measure_interleaved(
        self, template_ref: str, shape: Shape, candidates: Sequence[Candidate], *, seed: int | None = None,
        check_seeds: int | None = None, near_bound: NearBoundChecks | None = None,
    ) -> list[MeasureResult]:
        """Each candidate, timed in one interleaved round; one result per candidate, in order. Each is
        verified on ``check_seeds`` input sets (``seed``, ``seed + 1``, …; default: the options' count)
        before it is timed, and one near its error bounds there on ``near_bound``'s extra sets (the seeds
        that follow; default: the options'); a config short of ``near_bound``'s headroom under a bound over
        the sets checked is WRONG_RESULT (:class:`~tuner.measure.protocol.NearBoundChecks`)."""
        ...

    def last_call_times(self) -> CallTimes | None:
        """Where the calling thread's last ``measure_interleaved`` (or ``measure``) call spent its time; None
        before one, after one that raised, or where the implementation measures nothing (a replay)."""
        ...
