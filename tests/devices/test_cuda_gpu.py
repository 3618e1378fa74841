"""The CUDA backend and the measurer on a real GPU (skipped where there is none).

Expectations are bounds that hold on any recent data-centre GPU (figures quoted for an H200: 4.3 TB/s copy
ceiling, 60 MB L2).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MiB = 1 << 20


@pytest.fixture(scope="module")
def backend():  # type: ignore[no-untyped-def]
    from tuner.measure.devices.cuda import CudaBackend

    return CudaBackend(0)


@pytest.fixture(scope="module")
def add_one():  # type: ignore[no-untyped-def]
    """A Triton kernel launched straight from Python (driver API, no aten op around it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        _add_one[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)

    return launch


def test_flush_buffer_is_at_least_twice_the_l2(backend) -> None:  # type: ignore[no-untyped-def]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert backend.l2_bytes == l2 > 0
    assert backend.flush_bytes >= 2 * l2


def test_copy_samples_match_the_memory_bandwidth(backend) -> None:  # type: ignore[no-untyped-def]
    src = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    samples = backend.time([lambda: dst.copy_(src)], n_samples=20, warmup=3)
    assert len(samples) == 1 and len(samples[0]) == 20
    assert all(s > 0 for s in samples[0])
    bandwidth = 2 * src.numel() / (statistics.median(samples[0]) * 1e-6)  # bytes read + written per second
    assert 0.3e12 < bandwidth < 10e12, bandwidth


def test_triton_kernels_count_and_the_flush_does_not(backend, add_one) -> None:  # type: ignore[no-untyped-def]
    tiny_x = torch.randn(1024, device="cuda")
    tiny_y = torch.empty_like(tiny_x)
    big_x = torch.randn(4 * MiB, device="cuda")  # 16 MiB in, 16 MiB out
    big_y = torch.empty_like(big_x)
    other_x, other_y = torch.randn_like(big_x), torch.empty_like(big_x)  # cold: not in L2 after the first

    def twice() -> None:
        add_one(big_x, big_y)
        add_one(other_x, other_y)

    tiny, once, two = backend.time(
        [lambda: add_one(tiny_x, tiny_y), lambda: add_one(big_x, big_y), twice], n_samples=30, warmup=3
    )
    assert all(len(s) == 30 and min(s) > 0 for s in (tiny, once, two))
    # zeroing the flush buffer (>= 2 × L2, >= 64 MiB) takes tens of µs: a tiny kernel's sample excludes it
    assert statistics.median(tiny) < 15.0, statistics.median(tiny)
    ratio = statistics.median(two) / statistics.median(once)
    assert 1.5 < ratio < 2.6, ratio  # a sample sums the durations of all of its kernels

    timing = backend.time_by_kernel([twice], n_samples=5, warmup=1)
    ((name, per_sample),) = timing.kernels[0].items()  # one kernel name, launched twice per sample
    assert "add_one" in name and per_sample == timing.samples[0]


def test_cuda_events_fallback(add_one) -> None:  # type: ignore[no-untyped-def]
    from tuner.measure.devices.cuda import CudaEventsBackend
    from tuner.results import Timer

    events = CudaEventsBackend(0)
    assert events.timer is Timer.CUDA_EVENTS
    x = torch.randn(4 * MiB, device="cuda")
    y = torch.empty_like(x)
    samples = events.time([lambda: add_one(x, y)], n_samples=10, warmup=2)
    assert len(samples[0]) == 10 and min(samples[0]) > 0


def test_fingerprint(backend) -> None:  # type: ignore[no-untyped-def]
    fp = backend.fingerprint()
    assert fp.kind == "cuda"
    assert fp.device_name == torch.cuda.get_device_name(0)
    assert fp.runtime == torch.version.cuda
    assert fp.driver, "neither NVML (pynvml) nor nvidia-smi gave the driver version"
    assert {"python", "torch", "triton"} <= set(fp.libraries)
    assert fp.info["sm_count"] > 0 and fp.info["l2_bytes"] > 0 and fp.info["total_memory_bytes"] > 0
    assert 1e11 < float(fp.info["copy_bw_bytes_per_s"]) < 2e13
    assert backend.copy_bandwidth() == fp.info["copy_bw_bytes_per_s"]  # cached per process


@pytest.fixture(scope="module")
def cuda_measurer() -> Iterator[object]:
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.measurer import MeasureOptions, Measurer

    with Measurer(DeviceSpec("cuda"), MeasureOptions(n_samples=20, warmup=3, timeout_s=180.0)) as m:
        yield m


def test_measurer_on_cuda(cuda_measurer) -> None:  # type: ignore[no-untyped-def]
    from tests.fixtures.fault_templates import REF
    from tuner.frozen import Config, Shape
    from tuner.measure.measurer import Candidate
    from tuner.results import Status, Timer

    shape = Shape(n=1 << 20)
    ok = cuda_measurer.measure(REF, shape, Candidate(Config(mode="ok", BLOCK=1024)))
    assert ok.status is Status.OK, ok.reason
    assert ok.timer is Timer.CUPTI and ok.summary is not None and ok.summary.n == 20
    assert 0 < ok.summary.median_us < 1000

    # the hang mode is left out: it would spin a GPU kernel until the timeout
    for mode, status in [
        ("wrong", Status.WRONG_RESULT),
        ("unwritten", Status.WRONG_RESULT),
        ("compile_error", Status.COMPILE_ERROR),
        ("raise", Status.RUNTIME_ERROR),
        ("segfault", Status.RUNTIME_ERROR),
    ]:
        result = cuda_measurer.measure(REF, shape, Candidate(Config(mode=mode, BLOCK=1024)))
        assert result.status is status, (mode, result.reason)

    results = cuda_measurer.measure_interleaved(
        REF, shape, [Candidate(Config(mode="ok", BLOCK=1024)), Candidate(comparator="torch"),
                     Candidate(Config(mode="ok", BLOCK=128))]
    )
    assert [r.status for r in results] == [Status.OK] * 3, [r.reason for r in results]
    assert cuda_measurer.fingerprint().kind == "cuda"
