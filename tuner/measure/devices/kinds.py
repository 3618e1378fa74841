"""Which backend serves a device kind, and ``auto`` resolved to the best kind this host has.

Kept apart from :mod:`tuner.measure.devices.base` (the contract the backends implement) so that the contract
imports none of them: each backend is imported lazily, on first use (the CUDA one imports torch.profiler).
Pure functions; thread-safe.
"""

from __future__ import annotations

from tuner.errors import DeviceError
from tuner.keys import KINDS, DeviceKind
from tuner.measure.devices.base import DeviceBackend, DeviceSpec


def backend_class(kind: DeviceKind) -> type[DeviceBackend]:
    """The backend class of a kind (imported lazily: the CUDA one imports torch.profiler)."""
    if kind == "cuda":
        from tuner.measure.devices.cuda import CudaBackend

        return CudaBackend
    if kind == "npu":
        from tuner.measure.devices.npu import NpuBackend

        return NpuBackend
    if kind == "cpu":
        from tuner.measure.devices.cpu import CpuBackend

        return CpuBackend
    raise DeviceError(f"unknown device kind {kind!r}; expected one of {', '.join(KINDS)} or auto")


def resolve(spec: DeviceSpec) -> DeviceSpec:
    """Turn ``auto`` into the best available kind (cuda > npu > cpu); DeviceError if the kind is absent."""
    if spec.kind == "auto":
        for kind in KINDS:
            if backend_class(kind).available():
                return DeviceSpec(kind, spec.index)
        raise DeviceError("no device backend is available")
    if not backend_class(spec.kind).available():
        raise DeviceError(f"device kind {spec.kind!r} is not available on this host")
    return spec
