"""The measuring contract the driver depends on.

Implemented by :class:`tuner.measure.measurer.Measurer` (candidates built, verified and timed in a subprocess
on a real device) and :class:`tuner.measure.devices.replay.ReplayMeasurer` (answers from a recorded store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tuner.frozen import Shape
from tuner.measure.devices.base import Fingerprint
from tuner.measure.protocol import Candidate, MeasureOptions, NearBoundChecks
from tuner.results import MeasureResult


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
        self, template_ref: str, shape: Shape, candidate: Candidate, *, seed: int | None = None
    ) -> MeasureResult:
        """One candidate on fresh inputs from ``seed``."""
        ...

    def measure_interleaved(
        self, template_ref: str, shape: Shape, candidates: Sequence[Candidate], *, seed: int | None = None,
        check_seeds: int | None = None, near_bound: NearBoundChecks | None = None,
    ) -> list[MeasureResult]:
        """Each candidate, timed in one interleaved round; one result per candidate, in order. Each is
        verified on ``check_seeds`` input sets (``seed``, ``seed + 1``, …; default: the options' count)
        before it is timed, and one near its error bounds there on ``near_bound``'s extra sets (the seeds
        that follow; default: the options')."""
        ...
