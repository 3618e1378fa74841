"""The device backend contract (the fingerprint every measurement is keyed by lives in :mod:`tuner.keys`).

A backend instance lives inside a measurement subprocess and owns one device. It is not thread-safe:
one candidate runs at a time. Backends know nothing of templates; they time zero-argument callables.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from tuner.keys import DeviceKind, Fingerprint
from tuner.results import Timer


@dataclass(frozen=True)
class DeviceSpec:
    """Which device a measurer uses: a kind (or ``auto``) and an index among devices of that kind."""

    kind: Literal["auto", "cuda", "npu", "cpu"] = "auto"
    index: int = 0


@dataclass(frozen=True)
class Timing:
    """What :meth:`DeviceBackend.time_by_kernel` returns, per callable in call order: ``samples`` (µs per
    sample, as :meth:`DeviceBackend.time`) and ``kernels`` (activity name -> µs per sample, 0 in a sample
    where it did not run; empty where the backend cannot tell kernels apart)."""

    samples: list[list[float]]
    kernels: list[dict[str, list[float]]]


class DeviceBackend(abc.ABC):
    """One device of one kind, as seen from inside a measurement subprocess.

    Contract:
      * ``time`` runs every callable ``warmup`` times, then ``n_samples`` rounds in which each callable
        runs once, in the given order (interleaved), each preceded by :meth:`flush_l2`; it returns one list
        of per-sample times in microseconds per callable. For device backends a sample is the *device*
        time of the kernels the callable launched; for the CPU backend it is wall time.
      * Exceptions from the callables propagate unchanged (the measurer classifies them); failures of the
        backend itself raise :class:`DeviceError`.
    """

    kind: ClassVar[DeviceKind]
    timer: ClassVar[Timer]

    def __init__(self, index: int = 0) -> None:
        self.index = index

    @classmethod
    @abc.abstractmethod
    def available(cls) -> bool:
        """Whether a device of this kind is usable in this process (cheap; must not initialise a context)."""

    @classmethod
    def subprocess_env(cls, index: int) -> dict[str, str]:
        """Environment variables a measurement subprocess needs *before* importing torch/triton."""
        return {}

    @property
    @abc.abstractmethod
    def torch_device(self) -> str:
        """The torch device string inputs live on (``cuda:0``, ``npu:0``, ``cpu``)."""

    @abc.abstractmethod
    def fingerprint(self) -> Fingerprint: ...

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    def flush_l2(self) -> None:
        """Evict the device's last-level cache (a no-op where there is none to flush)."""

    @abc.abstractmethod
    def time(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> list[list[float]]: ...

    def time_by_kernel(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> Timing:
        """:meth:`time`, with each sample's device time per kernel where the backend sees the kernels
        (default: it does not, and ``Timing.kernels`` holds an empty mapping per callable). Same errors."""
        return Timing(self.time(fns, n_samples=n_samples, warmup=warmup), [{} for _ in fns])

    def warm_up(self, fns: Sequence[Callable[[], None]], warmup: int) -> None:
        """Run each callable ``warmup`` times, interleaved and after a flush as when timed, then wait for
        the device: compilation, autotuning and allocator growth happen here, outside the samples."""
        for _ in range(warmup):
            for fn in fns:
                self.flush_l2()
                fn()
        self.synchronize()
