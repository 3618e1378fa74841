"""NPU backend (Ascend, through torch_npu): per-sample device time from the torch_npu profiler.

**Not yet run on an NPU.** Written against torch_npu's documented API (``torch_npu.npu.set_device`` /
``synchronize`` / ``get_device_properties``, ``torch_npu.profiler.profile`` with ``ProfilerActivity.NPU``,
``schedule``, ``tensorboard_trace_handler``, ``_ExperimentalConfig``, ``torch_npu.utils.get_cann_version``)
and unit-tested with a stand-in ``torch_npu`` module (``tests/fixtures/fake_torch_npu.py``).

How a sample's device time is taken: one profiler session, with a schedule that records every step
(``wait=0, warmup=0, active=steps+1``) and a ``tensorboard_trace_handler`` writing into a temporary
directory, covers the sampling loop. The L2 flush and each call are profiler steps of their own, each closed
by a synchronisation and ``prof.step()``, so the step of a call holds only that call's kernels. When the
session ends, torch_npu's parser writes ``ASCEND_PROFILER_OUTPUT/kernel_details.csv``; a sample's device
time is the sum of ``Duration(us)`` over the rows whose ``Step Id`` is the call's step number
(``prof.step_num`` after the ``step()`` that opened it).

L2 flush: torch_npu documents no call that clears the L2, so a uint8 buffer of ≥ 2× the L2 size is zeroed
(the L2 size from the device properties where they expose it, else 192 MiB, the L2 of Ascend 910B parts).
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from tuner.errors import DeviceError
from tuner.measure.devices.base import DeviceBackend, DeviceKind, Fingerprint
from tuner.measure.devices.common import FLUSH_MIN_BYTES, check_counts, library_versions
from tuner.results import Timer

ASSUMED_L2_BYTES = 192 << 20


class NpuBackend(DeviceBackend):
    """One Ascend NPU. ``tensor_device`` overrides the torch device of the flush buffer (default ``npu:<i>``);
    tests with the stand-in module, which has no tensors of its own, pass ``cpu``."""

    kind: ClassVar[DeviceKind] = "npu"
    timer: ClassVar[Timer] = Timer.NPU_PROFILER

    def __init__(self, index: int = 0, *, tensor_device: str | None = None) -> None:
        super().__init__(index)
        import torch
        import torch_npu

        if not torch_npu.npu.is_available():
            raise DeviceError("torch_npu imports but no NPU is available")
        self._torch = torch
        self._npu = torch_npu
        torch_npu.npu.set_device(index)
        props = torch_npu.npu.get_device_properties(index)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0) or ASSUMED_L2_BYTES
        self.flush_bytes = max(2 * self.l2_bytes, FLUSH_MIN_BYTES)
        self._device = tensor_device or f"npu:{index}"
        self._flush_buffer = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self._device)

    @classmethod
    def available(cls) -> bool:
        try:
            import torch
            import torch_npu  # noqa: F401  (registers torch.npu)

            return bool(torch.npu.is_available())  # type: ignore[attr-defined]
        except Exception:  # not installed, or a broken install: not available
            return False

    @property
    def torch_device(self) -> str:
        return self._device

    def synchronize(self) -> None:
        self._npu.npu.synchronize()

    def flush_l2(self) -> None:
        self._flush_buffer.zero_()

    def time(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> list[list[float]]:
        check_counts(len(fns), n_samples, warmup)
        self.warm_up(fns, warmup)
        steps: list[list[int]] = [[0] * n_samples for _ in fns]
        with tempfile.TemporaryDirectory(prefix="tuner-npu-prof-") as tmp:
            with self._npu.profiler.profile(**self._profile_options(tmp, 2 * n_samples * len(fns))) as prof:
                opened = 0
                for s in range(n_samples):
                    for i, fn in enumerate(fns):
                        self.flush_l2()
                        opened = self._next_step(prof, opened)
                        fn()
                        opened = self._next_step(prof, opened)
                        # the step just closed held the call: its number is the one opened before it
                        steps[i][s] = _step_number(prof, opened) - 1
            totals = read_kernel_details(Path(tmp))
        return samples_from_steps(steps, totals)

    def _next_step(self, prof: Any, opened: int) -> int:
        self.synchronize()  # the step's kernels finish inside the step
        prof.step()
        return opened + 1

    def _profile_options(self, out_dir: str, n_steps: int) -> dict[str, Any]:
        api = self._npu.profiler
        options: dict[str, Any] = {
            "activities": [api.ProfilerActivity.CPU, api.ProfilerActivity.NPU],
            "schedule": api.schedule(wait=0, warmup=0, active=n_steps + 1, repeat=1),
            "on_trace_ready": api.tensorboard_trace_handler(out_dir),
        }
        config_cls = getattr(api, "_ExperimentalConfig", None)
        level = getattr(getattr(api, "ProfilerLevel", None), "Level0", None)
        if config_cls is not None and level is not None:
            extra: dict[str, Any] = {"profiler_level": level}
            no_metrics = getattr(getattr(api, "AiCMetrics", None), "AiCoreNone", None)
            if no_metrics is not None:
                extra["aic_metrics"] = no_metrics
            options["experimental_config"] = config_cls(**extra)
        return options

    def fingerprint(self) -> Fingerprint:
        npu = self._npu.npu
        props = npu.get_device_properties(self.index)
        info: dict[str, float | int | str] = {
            "l2_bytes": self.l2_bytes,
            "flush_bytes": self.flush_bytes,
            "total_memory_bytes": int(getattr(props, "total_memory", 0) or 0),
        }
        for attr in ("cube_core_num", "vector_core_num"):
            if getattr(props, attr, None) is not None:
                info[attr] = int(getattr(props, attr))
        libraries = library_versions()
        libraries["torch_npu"] = str(getattr(self._npu, "__version__", "unknown"))
        return Fingerprint(
            kind="npu",
            device_name=str(npu.get_device_name(self.index)),
            driver=self._cann_version("DRIVER"),
            runtime=self._cann_version("CANN"),
            libraries=libraries,
            info=info,
        )

    def _cann_version(self, module: str) -> str:
        try:
            return str(self._npu.utils.get_cann_version(module=module) or "")
        except Exception:  # documented only for CANN >= 8.1.RC1; older stacks have no such call
            return ""


def _step_number(prof: Any, opened: int) -> int:
    """The profiler's current step number (``step_num``), or the count of steps opened if it has none."""
    value = getattr(prof, "step_num", None)
    return int(value) if isinstance(value, int) else opened


def read_kernel_details(root: Path) -> dict[int, float]:
    """Summed ``Duration(us)`` per ``Step Id`` over every kernel_details.csv under ``root``.

    Rows without a step id (kernels outside any step) are skipped. DeviceError if no file was written or a
    file lacks the step or duration column.
    """
    paths = sorted(root.rglob("kernel_details.csv"))
    if not paths:
        raise DeviceError(f"the NPU profiler wrote no kernel_details.csv under {root}")
    totals: dict[int, float] = {}
    for path in paths:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            columns = {name.strip().lower(): name for name in reader.fieldnames or []}
            step_col = columns.get("step id")
            dur_col = columns.get("duration(us)")
            if step_col is None or dur_col is None:
                raise DeviceError(f"{path} has no 'Step Id' and 'Duration(us)' columns: {list(columns)}")
            for row in reader:
                step = _as_int(row.get(step_col))
                if step is not None:
                    totals[step] = totals.get(step, 0.0) + float(row[dur_col])
    return totals


def samples_from_steps(steps: Sequence[Sequence[int]], totals: dict[int, float]) -> list[list[float]]:
    """Per-candidate samples from step numbers; DeviceError if a sample's step has no kernel."""
    missing = [step for row in steps for step in row if step not in totals]
    if missing:
        total = sum(len(row) for row in steps)
        raise DeviceError(f"{len(missing)} of {total} samples have no kernel in kernel_details.csv")
    return [[totals[step] for step in row] for row in steps]


def _as_int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "", "N/A") else None
    except ValueError:
        return None
