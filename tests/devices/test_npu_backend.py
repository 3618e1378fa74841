"""The NPU backend against a stand-in torch_npu (no NPU here): availability, step bookkeeping of the
profiler session, per-sample times read from kernel_details.csv, and the fingerprint."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.fixtures.fake_torch_npu import kernel_durations_us, make_stand_in
from tuner.errors import DeviceError
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.devices.kinds import resolve
from tuner.measure.devices.npu import NpuBackend
from tuner.results import Timer


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch):
    module = make_stand_in()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", module.npu, raising=False)
    return module


def test_not_available_without_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError
    assert NpuBackend.available() is False


def test_available_follows_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    module = make_stand_in(available=False)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", module.npu, raising=False)
    assert NpuBackend.available() is False


def test_auto_prefers_npu_over_cpu_when_present(stand_in) -> None:
    if torch.cuda.is_available():
        pytest.skip("cuda ranks above npu")
    assert resolve(DeviceSpec("auto")).kind == "npu"


def test_samples_are_the_kernel_time_of_each_call_step(stand_in) -> None:
    backend = NpuBackend(0, tensor_device="cpu")
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    samples = backend.time(fns, n_samples=4, warmup=2)

    # steps alternate flush / call: call i of sample s is step 2*(s*2 + i) + 1
    expected = [[sum(kernel_durations_us(2 * (s * 2 + i) + 1)) for s in range(4)] for i in range(2)]
    assert samples == expected
    assert calls == ["a", "b"] * 2 + ["a", "b"] * 4  # warm-up, then interleaved rounds
    assert backend.timer is Timer.NPU_PROFILER
    assert ("set_device", 0) in stand_in.calls
    schedule = next(v for name, v in stand_in.calls if name == "schedule")
    assert schedule == {"wait": 0, "active": 2 * 4 * 2 + 1, "warmup": 0, "repeat": 1}
    profile = next(v for name, v in stand_in.calls if name == "profile")
    assert [a.value for a in profile["activities"]] == ["CPU", "NPU"]
    assert profile["experimental_config"].kwargs["profiler_level"].value == "Level0"
    # each step is closed by a synchronisation: 1 after warm-up + 2 per call
    assert sum(1 for name, _ in stand_in.calls if name == "synchronize") == 1 + 2 * 4 * 2


def test_step_id_header_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    module = make_stand_in(step_column="Step ID")
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", module.npu, raising=False)
    samples = NpuBackend(0, tensor_device="cpu").time([lambda: None], n_samples=3, warmup=0)
    assert samples == [[sum(kernel_durations_us(2 * s + 1)) for s in range(3)]]


def test_flush_buffer_is_twice_the_assumed_l2(stand_in) -> None:
    backend = NpuBackend(0, tensor_device="cpu")
    assert backend.l2_bytes == 192 << 20  # the stand-in's properties expose no L2 size
    assert backend.flush_bytes >= 2 * backend.l2_bytes


def test_fingerprint(stand_in) -> None:
    fp = NpuBackend(0, tensor_device="cpu").fingerprint()
    assert fp.kind == "npu"
    assert fp.device_name == "Ascend910B2"
    assert fp.runtime == "8.1.RC1" and fp.driver == "24.1.rc3"
    assert fp.libraries["torch_npu"] == "2.5.1.post-stand-in"
    assert fp.info["cube_core_num"] == 24 and fp.info["total_memory_bytes"] == 64 << 30


def test_missing_profiler_output_is_a_device_error(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = NpuBackend(0, tensor_device="cpu")
    monkeypatch.setattr(stand_in.profiler, "tensorboard_trace_handler", lambda d: None)
    with pytest.raises(DeviceError, match=r"kernel_details\.csv"):
        backend.time([lambda: None], n_samples=2, warmup=0)
