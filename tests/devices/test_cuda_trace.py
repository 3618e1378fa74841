"""How the CUDA backend reads per-sample device time out of a profiler trace (no GPU needed).

Device activities are synthetic here; the labelled ranges in the last test come from a real torch.profiler
session, so that the export format of the installed torch is checked too.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tuner.errors import DeviceError
from tuner.measure.devices.cuda import (
    CudaBackend,
    backend_from_env,
    chrome_trace_events,
    device_time_by_range,
    kernels_from_ranges,
    samples_from_ranges,
)


class TraceBuilder:
    """A trace like kineto's: per sample, a flush launched outside the range, then the sample's launches."""

    def __init__(
        self, launch_cat: str = "cuda_driver", launches: bool = True, gpu_spans: bool = False
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.cpu, self.gpu, self.corr = 100.0, 5000.0, 1
        self.launch_cat, self.launches, self.gpu_spans = launch_cat, launches, gpu_spans

    def _device(self, cat: str, name: str, dur: float) -> None:
        if self.launches:
            self.events.append({"ph": "X", "cat": self.launch_cat, "name": "cuLaunchKernelEx", "ts": self.cpu,
                                "dur": 3.0, "args": {"cbid": 652, "correlation": self.corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": self.gpu, "dur": dur,
                            "args": {"correlation": self.corr, "stream": 7, "device": 0}})
        self.corr += 1
        self.cpu += 4.0
        self.gpu += dur + 0.5

    def sample(self, label: str, activities: list[tuple[str, float]]) -> None:
        self._device("kernel", "fill_flush", 30.0)  # the L2 flush, before the range
        cpu_start, gpu_start = self.cpu, self.gpu
        for cat, dur in activities:
            self._device(cat, f"{cat}_of_{label}", dur)
        # the range closes after its last launch call (3 µs long) and before the next flush is launched
        self.events.append({"ph": "X", "cat": "user_annotation", "name": label, "ts": cpu_start,
                            "dur": max(self.cpu - cpu_start - 0.5, 0.5)})
        self.cpu += 2.0
        if self.gpu_spans:
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": label, "ts": gpu_start,
                                "dur": self.gpu - gpu_start - 0.5})


def _two_samples(builder: TraceBuilder) -> list[dict[str, Any]]:
    builder.sample("s0", [("kernel", 2.5), ("kernel", 1.5)])
    builder.sample("s1", [("gpu_memcpy", 4.0), ("gpu_memset", 0.75), ("kernel", 2.0)])
    return builder.events


@pytest.mark.parametrize("launch_cat", ["cuda_driver", "cuda_runtime"])
def test_activities_are_attributed_through_their_launch_call(launch_cat: str) -> None:
    found = device_time_by_range(_two_samples(TraceBuilder(launch_cat)), ["s0", "s1"])
    assert (found["s0"].us, found["s0"].count) == (4.0, 2)  # the 30 µs flush is not counted
    assert (found["s1"].us, found["s1"].count) == (6.75, 3)  # memcpy and memset count too


def test_each_sample_is_broken_down_by_activity_name() -> None:
    builder = TraceBuilder()
    builder.sample("a0", [("kernel", 2.5), ("kernel", 1.5)])  # one name twice: summed within the sample
    builder.sample("b0", [("gpu_memcpy", 4.0)])
    builder.sample("a1", [("kernel", 3.0)])
    builder.sample("b1", [("gpu_memcpy", 5.0), ("kernel", 1.0)])
    # the builder names activities after their sample: rename them after their candidate
    for ev in builder.events:
        if ev.get("name", "").endswith(("_of_a0", "_of_a1")):
            ev["name"] = ev["name"].rsplit("_of_", 1)[0] + "_of_a"
        if ev.get("name", "").endswith(("_of_b0", "_of_b1")):
            ev["name"] = ev["name"].rsplit("_of_", 1)[0] + "_of_b"
    labels = [["a0", "a1"], ["b0", "b1"]]
    found = device_time_by_range(builder.events, [label for row in labels for label in row])
    assert found["a0"].by_name == {"kernel_of_a": 4.0}
    assert kernels_from_ranges(labels, found) == [
        {"kernel_of_a": [4.0, 3.0]},
        {"gpu_memcpy_of_b": [4.0, 5.0], "kernel_of_b": [0.0, 1.0]},  # 0 where it did not run
    ]
    assert samples_from_ranges(labels, found) == [[4.0, 3.0], [4.0, 6.0]]


def test_gpu_annotation_spans_place_activities_without_launch_records() -> None:
    found = device_time_by_range(_two_samples(TraceBuilder(launches=False, gpu_spans=True)), ["s0", "s1"])
    assert (found["s0"].us, found["s1"].us) == (4.0, 6.75)


def test_activities_that_cannot_be_placed_are_an_error() -> None:
    with pytest.raises(DeviceError, match="cannot be attributed"):
        device_time_by_range(_two_samples(TraceBuilder(launches=False)), ["s0", "s1"])


def test_a_trace_without_device_activity_is_an_error() -> None:
    events = [{"ph": "X", "cat": "user_annotation", "name": "s0", "ts": 1.0, "dur": 2.0}]
    with pytest.raises(DeviceError, match="no device activity"):
        device_time_by_range(events, ["s0"])


def test_a_sample_without_activity_is_an_error() -> None:
    builder = TraceBuilder()
    builder.sample("s0", [("kernel", 1.0)])
    builder.sample("s1", [])
    found = device_time_by_range(builder.events, ["s0", "s1"])
    with pytest.raises(DeviceError, match="1 of 2 samples"):
        samples_from_ranges([["s0", "s1"]], found)
    assert samples_from_ranges([["s0"]], found) == [[1.0]]


def test_ranges_of_a_real_profiler_session() -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    labels = [f"tuner#0#0#{s}" for s in range(3)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for label in labels:
            torch.zeros(8)  # outside any range, like the flush
            with record_function(label):
                torch.ones(64).sum()
    events = chrome_trace_events(prof)
    ranges = {ev["name"]: ev for ev in events if ev.get("name") in labels}
    assert set(ranges) == set(labels)
    # a synthetic launch in the middle of each real range, and its kernel
    for corr, label in enumerate(labels, start=1):
        mid = float(ranges[label]["ts"]) + float(ranges[label]["dur"]) / 2
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": mid, "dur": 0.1,
                       "args": {"correlation": 10_000 + corr}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": 1e9 + corr, "dur": float(corr),
                       "args": {"correlation": 10_000 + corr}})
    found = device_time_by_range(events, labels)
    assert samples_from_ranges([labels], found) == [[1.0, 2.0, 3.0]]


def test_timer_choice_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CUDA_TIMER", "stopwatch")
    with pytest.raises(DeviceError, match="TUNER_CUDA_TIMER"):
        backend_from_env(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_cuda_backend_without_cuda() -> None:
    assert CudaBackend.available() is False
    with pytest.raises(DeviceError, match="not available"):
        CudaBackend(0)


def test_launch_records_and_gpu_annotations_must_agree() -> None:
    builder = TraceBuilder(gpu_spans=True)
    events = _two_samples(builder)
    found = device_time_by_range(events, ["s0", "s1"])  # consistent: both methods agree
    assert (found["s0"].us, found["s1"].us) == (4.0, 6.75)
    for ev in events:  # now s1's GPU annotation claims s0's kernels too
        if ev["cat"] == "gpu_user_annotation" and ev["name"] == "s1":
            ev["ts"] -= 100.0
            ev["dur"] += 100.0
    s0_start = next(ev["ts"] for ev in events if ev["cat"] == "gpu_user_annotation" and ev["name"] == "s0")
    for ev in events:
        if ev["cat"] == "gpu_user_annotation" and ev["name"] == "s0":
            ev["ts"], ev["dur"] = s0_start - 200.0, 1.0
    with pytest.raises(DeviceError, match="different samples"):
        device_time_by_range(events, ["s0", "s1"])
