"""The worker's timing phase when something fails while candidates are timed together.

The device here is a CPU backend whose L2 flush meets an asynchronous device fault, the way a CUDA error
left by a kernel surfaces at the next call on the device, outside any candidate's call.
"""

from __future__ import annotations

import pytest

from tuner.errors import DeviceError
from tuner.frozen import Config
from tuner.measure.child import Runnable, time_together
from tuner.measure.devices.cpu import CpuBackend
from tuner.measure.protocol import MeasureOptions
from tuner.results import Status

OPTIONS = MeasureOptions(n_samples=4, warmup=0)


class FaultyFlushBackend(CpuBackend):
    """Raises ``error`` from its n-th flush."""

    def __init__(self, error: Exception, on_flush: int) -> None:
        super().__init__()
        self.error, self.on_flush, self.flushes = error, on_flush, 0

    def flush_l2(self) -> None:
        self.flushes += 1
        if self.flushes == self.on_flush:
            raise self.error


def runnable(name: str, fail: bool = False) -> Runnable:
    def kernel(inputs: object, outputs: object) -> None:
        if fail:
            raise RuntimeError(f"{name} failed")

    return Runnable(Config(name=name), kernel, {}, {}, {"y": 0.0}, 0.1, 0.1)


def test_all_ok() -> None:
    timed = time_together(CpuBackend(), [(0, runnable("a")), (1, runnable("b"))], OPTIONS)
    assert [(p, r.status, r.summary.n if r.summary else 0) for p, r in timed.results] == [
        (0, Status.OK, 4), (1, Status.OK, 4)]
    assert timed.retry == [] and not timed.split


def test_the_candidate_that_raises_is_blamed_and_the_others_retried() -> None:
    ready = [(0, runnable("a")), (3, runnable("b", fail=True)), (5, runnable("c"))]
    timed = time_together(CpuBackend(), ready, OPTIONS)
    assert [(p, r.status) for p, r in timed.results] == [(3, Status.RUNTIME_ERROR)]
    assert "b failed" in (timed.results[0][1].reason or "")
    assert timed.retry == [0, 5] and not timed.split


def test_a_device_fault_outside_the_calls_splits_the_group() -> None:
    backend = FaultyFlushBackend(RuntimeError("CUDA error: an illegal memory access was encountered"), 3)
    timed = time_together(backend, [(0, runnable("a")), (1, runnable("b"))], OPTIONS)
    assert timed.results == [] and timed.retry == [0, 1] and timed.split


def test_a_device_fault_with_one_candidate_blames_it() -> None:
    backend = FaultyFlushBackend(RuntimeError("CUDA error: unspecified launch failure"), 2)
    timed = time_together(backend, [(4, runnable("a"))], OPTIONS)
    assert [(p, r.status) for p, r in timed.results] == [(4, Status.RUNTIME_ERROR)]


def test_other_failures_of_the_backend_are_device_errors() -> None:
    with pytest.raises(DeviceError, match="outside the candidates"):
        time_together(FaultyFlushBackend(OSError("profiler buffer full"), 2), [(0, runnable("a"))], OPTIONS)
