"""CPU backend, for tests and demos: Triton kernels run under the interpreter, times are CPU wall times.

Its samples are ``time.perf_counter`` intervals around each call (``Timer.CPU_WALL``), not device times;
results carry that timer so that no report mistakes them for GPU figures. There is no cache to flush.
"""

from __future__ import annotations

import os
import platform
import time as _time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from tuner.measure.devices.base import DeviceBackend, DeviceKind, Fingerprint
from tuner.measure.devices.common import check_counts, comparator_versions, library_versions
from tuner.results import Timer


class CpuBackend(DeviceBackend):
    """The host CPU. Always available; Triton runs through its interpreter (``TRITON_INTERPRET=1``)."""

    kind: ClassVar[DeviceKind] = "cpu"
    timer: ClassVar[Timer] = Timer.CPU_WALL

    @classmethod
    def available(cls) -> bool:
        return True

    @classmethod
    def subprocess_env(cls, index: int) -> dict[str, str]:
        # Triton reads the variable when it is first imported, so it must be in the worker's environment.
        return {"TRITON_INTERPRET": "1"}

    @property
    def torch_device(self) -> str:
        return "cpu"

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(
            kind="cpu",
            device_name=cpu_model_name(),
            driver="",
            runtime="triton-interpreter",
            libraries=library_versions(),
            info={"logical_cpus": os.cpu_count() or 0, "machine": platform.machine(), **comparator_versions()},
        )

    def synchronize(self) -> None:
        return None

    def flush_l2(self) -> None:
        return None

    def time(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> list[list[float]]:
        check_counts(len(fns), n_samples, warmup)
        self.warm_up(fns, warmup)
        samples: list[list[float]] = [[] for _ in fns]
        for _ in range(n_samples):
            for fn, out in zip(fns, samples, strict=True):
                self.flush_l2()
                start = _time.perf_counter()
                fn()
                out.append((_time.perf_counter() - start) * 1e6)
        return samples


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo where there is one, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"
