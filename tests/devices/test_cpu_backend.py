"""The CPU backend: interleaved wall-time samples, argument checks, environment and fingerprint."""

from __future__ import annotations

import time

import pytest

from tuner.measure.devices.base import DeviceSpec
from tuner.measure.devices.cpu import CpuBackend
from tuner.measure.devices.kinds import backend_class, resolve
from tuner.results import SampleSummary, Timer


def test_time_interleaves_and_measures_wall_time() -> None:
    order: list[str] = []

    def fast() -> None:
        order.append("fast")

    def slow() -> None:
        order.append("slow")
        time.sleep(0.002)

    samples = CpuBackend().time([fast, slow], n_samples=5, warmup=2)
    assert order == ["fast", "slow"] * 7  # 2 warm-up rounds, then 5 interleaved rounds
    assert [len(s) for s in samples] == [5, 5]
    assert all(s >= 0 for s in samples[0])
    assert min(samples[1]) >= 2000.0  # µs: the sleep is inside the timed call
    assert SampleSummary.of(samples[0]).median_us < SampleSummary.of(samples[1]).median_us


@pytest.mark.parametrize(
    ("fns", "n_samples", "warmup"), [([], 1, 0), ([lambda: None], 0, 0), ([lambda: None], 1, -1)]
)
def test_time_rejects_bad_counts(fns, n_samples: int, warmup: int) -> None:
    with pytest.raises(ValueError):
        CpuBackend().time(fns, n_samples=n_samples, warmup=warmup)


def test_exceptions_of_callables_propagate() -> None:
    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        CpuBackend().time([boom], n_samples=1, warmup=0)


def test_environment_and_fingerprint() -> None:
    assert CpuBackend.subprocess_env(0) == {"TRITON_INTERPRET": "1"}
    assert backend_class("cpu") is CpuBackend
    assert resolve(DeviceSpec("cpu")) == DeviceSpec("cpu", 0)
    backend = CpuBackend()
    assert backend.timer is Timer.CPU_WALL and backend.torch_device == "cpu"
    fp = backend.fingerprint()
    assert fp.kind == "cpu" and fp.runtime == "triton-interpreter" and fp.device_name
    assert {"python", "torch", "triton"} <= set(fp.libraries)
    assert fp.info["logical_cpus"] >= 1
    assert fp.hash() == backend.fingerprint().hash()


def test_summary_figures() -> None:
    summary = SampleSummary.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (summary.min_us, summary.median_us, summary.max_us, summary.n) == (1.0, 3.0, 5.0, 5)
    assert summary.p20_us == pytest.approx(1.8) and summary.p80_us == pytest.approx(4.2)
    assert summary.mean_us == pytest.approx(3.0)
