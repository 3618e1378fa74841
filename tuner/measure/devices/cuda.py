"""CUDA backend: per-sample device time from CUPTI (torch.profiler / kineto), L2 flushed before each sample.

How a sample's device time is taken (``CudaBackend.time``):

1. Warm-up calls run first, outside any profiler session, then the device is synchronised.
2. One ``torch.profiler.profile(activities=[CPU, CUDA])`` session covers the whole sampling loop. In each
   round, for each candidate: the L2 flush (``zero_()`` of a buffer ≥ 2× L2) is launched, *then* the call
   runs inside ``torch.profiler.record_function(label)``, where the label is unique to (run, candidate,
   sample). The flush is therefore outside every range.
3. The session is exported as a Chrome trace (a format stable across torch 2.x) and
   :func:`device_time_by_range` attributes each device activity — categories ``kernel``, ``gpu_memcpy``,
   ``gpu_memset`` — to a range: the activity's ``args.correlation`` names the CUPTI correlation id of the
   host call that launched it (``cuda_runtime`` or ``cuda_driver`` event; Triton launches through the driver
   API, ``cuLaunchKernelEx``), and that call's CPU timestamp falls inside exactly one range (or none, for the
   flush). Activities whose launch call is missing from the trace are placed on the GPU timeline inside the
   range's ``gpu_user_annotation`` span instead; if neither exists, DeviceError (never a silent under-count).
   Where both exist and place an activity in two different ranges, DeviceError too.
4. A sample's time is the sum of the durations of its activities, in µs. Every range must hold at least one
   activity, else DeviceError.

Why not ``FunctionEvent.device_time_total`` of the range: ``record_function`` is a USER_SCOPE range, for which
the profiler pushes a *user* correlation id; a kernel launched straight from Python (Triton's launcher calls
the driver without an aten op around it) is linked only to the innermost non-user op, so it can be missing
from the range's total.

``CudaEventsBackend`` (``Timer.CUDA_EVENTS``) times with CUDA events instead; it is used only when asked for
(``TUNER_CUDA_TIMER=events``) and includes launch gaps between a candidate's kernels.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tuner.errors import DeviceError
from tuner.measure.devices.base import DeviceBackend, DeviceKind, Fingerprint, Timing
from tuner.measure.devices.common import (
    FLUSH_MIN_BYTES,
    check_counts,
    comparator_versions,
    library_versions,
    run_quiet,
)
from tuner.results import Timer

COPY_BYTES = 1 << 30  # buffer copied to measure the device-to-device bandwidth
COPY_REPEATS = 5
TIMER_ENV = "TUNER_CUDA_TIMER"

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
GPU_RANGE_CATEGORY = "gpu_user_annotation"

_copy_bandwidth: dict[int, float] = {}  # per process: device index → bytes/s


class CudaBackend(DeviceBackend):
    """One CUDA device, timed with CUPTI. Creating it initialises CUDA in this process (a worker)."""

    kind: ClassVar[DeviceKind] = "cuda"
    timer: ClassVar[Timer] = Timer.CUPTI

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        import torch

        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available in this process")
        if not 0 <= index < torch.cuda.device_count():
            raise DeviceError(f"no CUDA device {index}; {torch.cuda.device_count()} visible")
        self._torch = torch
        torch.cuda.set_device(index)
        props = torch.cuda.get_device_properties(index)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.flush_bytes = max(2 * self.l2_bytes, FLUSH_MIN_BYTES)
        self._flush_buffer = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.torch_device)
        self._runs = itertools.count()
        self._profiler_ready = False

    @classmethod
    def available(cls) -> bool:
        try:
            import torch

            return bool(torch.cuda.is_available())
        except Exception:  # a broken install is "not available", not a crash of the caller
            return False

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}"

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.index)

    def flush_l2(self) -> None:
        self._flush_buffer.zero_()

    def time(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> list[list[float]]:
        return self.time_by_kernel(fns, n_samples=n_samples, warmup=warmup).samples

    def time_by_kernel(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> Timing:
        check_counts(len(fns), n_samples, warmup)
        self.warm_up(fns, warmup)
        self._warm_profiler()
        run = next(self._runs)
        labels = [[f"tuner#{run}#{i}#{s}" for s in range(n_samples)] for i in range(len(fns))]
        events = self._profile(fns, labels, n_samples)
        found = device_time_by_range(events, [label for row in labels for label in row])
        return Timing(samples_from_ranges(labels, found), kernels_from_ranges(labels, found))

    def _warm_profiler(self) -> None:
        # The first profiler session of a process initialises CUPTI; keep that out of the timed sessions.
        if not self._profiler_ready:
            self._profile([self.flush_l2], [["tuner#warm"]], 1)
            self._profiler_ready = True

    def _profile(
        self, fns: Sequence[Callable[[], None]], labels: Sequence[Sequence[str]], n_samples: int
    ) -> list[dict[str, Any]]:
        from torch.profiler import ProfilerActivity, profile, record_function

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for s in range(n_samples):
                for i, fn in enumerate(fns):
                    self.flush_l2()  # outside the range: its kernel is not counted
                    with record_function(labels[i][s]):
                        fn()
            self.synchronize()  # every activity must have finished before the session stops
        return chrome_trace_events(prof)

    # -- fingerprint --------------------------------------------------------------------------------
    def fingerprint(self) -> Fingerprint:
        torch = self._torch
        props = torch.cuda.get_device_properties(self.index)
        nvml_id = _nvml_id(props, self.index)
        info: dict[str, float | int | str] = {
            "sm_count": int(props.multi_processor_count),
            "l2_bytes": self.l2_bytes,
            "total_memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "flush_bytes": self.flush_bytes,
        }
        if nvml_id.startswith("GPU-"):  # recorded per measurement (tuner_measurements.device_uuid), not keyed
            info["uuid"] = nvml_id
        clock = sm_clock_mhz(nvml_id)
        if clock is not None:
            info["sm_clock_mhz_at_start"] = clock
        info["copy_bw_bytes_per_s"] = self.copy_bandwidth()
        info.update(comparator_versions())
        return Fingerprint(
            kind="cuda",
            device_name=str(props.name),
            driver=driver_version(nvml_id) or "",
            runtime=str(torch.version.cuda or ""),
            libraries=library_versions(),
            info=info,
        )

    def copy_bandwidth(self) -> float:
        """Device-to-device copy bandwidth in bytes/s (read + written), best of a few 1 GiB copies; cached."""
        if self.index not in _copy_bandwidth:
            _copy_bandwidth[self.index] = self._measure_copy_bandwidth()
        return _copy_bandwidth[self.index]

    def _measure_copy_bandwidth(self) -> float:
        torch = self._torch
        nbytes = COPY_BYTES
        while True:
            try:
                src = torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device)
                dst = torch.empty_like(src)
                break
            except torch.cuda.OutOfMemoryError:
                if nbytes <= FLUSH_MIN_BYTES:
                    raise DeviceError("not enough device memory to measure the copy bandwidth") from None
                nbytes //= 4
        times_ms = []
        for repeat in range(COPY_REPEATS + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            if repeat >= 2:  # the first two copies warm the copy kernel and the allocator
                times_ms.append(start.elapsed_time(end))
        del src, dst
        torch.cuda.empty_cache()
        return 2 * nbytes / (min(times_ms) / 1e3)


class CudaEventsBackend(CudaBackend):
    """Declared fallback: samples are CUDA-event intervals around each call (launch gaps included)."""

    timer: ClassVar[Timer] = Timer.CUDA_EVENTS

    def time_by_kernel(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> Timing:
        # Events see the calls, not their kernels: no breakdown (the base class's answer).
        return DeviceBackend.time_by_kernel(self, fns, n_samples=n_samples, warmup=warmup)

    def time(
        self, fns: Sequence[Callable[[], None]], *, n_samples: int, warmup: int
    ) -> list[list[float]]:
        check_counts(len(fns), n_samples, warmup)
        self.warm_up(fns, warmup)
        torch = self._torch
        def event() -> Any:
            return torch.cuda.Event(enable_timing=True)

        pairs = [[(event(), event()) for _ in range(n_samples)] for _ in fns]
        for s in range(n_samples):
            for fn, row in zip(fns, pairs, strict=True):
                self.flush_l2()
                row[s][0].record()
                fn()
                row[s][1].record()
        self.synchronize()
        return [[start.elapsed_time(end) * 1e3 for start, end in row] for row in pairs]


def backend_from_env(index: int = 0) -> CudaBackend:
    """The CUDA backend the environment asks for: CUPTI, or CUDA events when ``TUNER_CUDA_TIMER=events``."""
    choice = os.environ.get(TIMER_ENV, "cupti").strip().lower()
    if choice in ("", "cupti"):
        return CudaBackend(index)
    if choice == "events":
        return CudaEventsBackend(index)
    raise DeviceError(f"{TIMER_ENV}={choice!r}: expected 'cupti' or 'events'")


# -- trace analysis (pure functions: tested without a GPU) ------------------------------------------
@dataclass
class RangeTime:
    """Device time attributed to one labelled range: summed durations (µs), number of activities, and
    the summed durations per activity name (kernel, memcpy or memset)."""

    us: float = 0.0
    count: int = 0
    by_name: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, us: float) -> None:
        self.us += us
        self.count += 1
        self.by_name[name] = self.by_name.get(name, 0.0) + us


class _SpanIndex:
    """Non-overlapping labelled intervals; finds the one containing a time point (bounds inclusive)."""

    def __init__(self, spans: Iterable[tuple[float, float, str]]) -> None:
        self._spans = sorted(spans)
        self._starts = [span[0] for span in self._spans]

    def __bool__(self) -> bool:
        return bool(self._spans)

    def find(self, t: float) -> str | None:
        pos = bisect.bisect_right(self._starts, t) - 1
        if pos >= 0 and t <= self._spans[pos][1]:
            return self._spans[pos][2]
        return None


def device_time_by_range(
    events: Iterable[Mapping[str, Any]], labels: Collection[str]
) -> dict[str, RangeTime]:
    """Attribute the device activities of a Chrome trace to the labelled ranges that launched them.

    Returns one :class:`RangeTime` per label (zero where nothing was attributed). Raises DeviceError when
    the trace holds no device activity at all, or holds activities that can be placed neither through
    their launch call nor through a GPU annotation span.
    """
    wanted = set(labels)
    cpu_spans: list[tuple[float, float, str]] = []
    gpu_spans: list[tuple[float, float, str]] = []
    launches: dict[int, float] = {}
    activities: list[Mapping[str, Any]] = []
    for ev in events:
        cat = ev.get("cat")
        if cat in DEVICE_CATEGORIES:
            activities.append(ev)
        elif cat in LAUNCH_CATEGORIES:
            corr = _correlation(ev)
            if corr is not None:
                launches[corr] = float(ev["ts"])
        elif ev.get("name") in wanted and "dur" in ev:
            span = (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]), str(ev["name"]))
            (gpu_spans if cat == GPU_RANGE_CATEGORY else cpu_spans).append(span)
    if not activities:
        raise DeviceError(
            "the profiler recorded no device activity (kernel, memcpy, memset): is CUPTI usable here?"
        )
    on_cpu, on_gpu = _SpanIndex(cpu_spans), _SpanIndex(gpu_spans)
    found = {label: RangeTime() for label in wanted}
    unplaced = contradicted = 0
    for act in activities:
        corr = _correlation(act)
        on_gpu_label = on_gpu.find(float(act["ts"])) if on_gpu else None
        if corr is not None and corr in launches:
            label = on_cpu.find(launches[corr])
            # Both methods place it, differently: one of them is wrong, so no figure can be trusted.
            contradicted += on_gpu_label is not None and on_gpu_label != label
        elif on_gpu:
            label = on_gpu_label
        else:
            unplaced += 1
            continue
        if label is not None:
            found[label].add(str(act.get("name", "?")), float(act.get("dur", 0.0)))
    if unplaced:
        raise DeviceError(
            f"{unplaced} device activities have neither a launch record nor a GPU annotation in the trace; "
            "their samples cannot be attributed"
        )
    if contradicted:
        raise DeviceError(
            f"{contradicted} device activities are placed in different samples by their launch record and "
            "by the GPU annotations (host and device clocks misaligned?)"
        )
    return found


def samples_from_ranges(labels: Sequence[Sequence[str]], found: Mapping[str, RangeTime]) -> list[list[float]]:
    """Per-candidate sample lists in label order; DeviceError if any sample has no device activity."""
    total = sum(len(row) for row in labels)
    empty = sum(1 for row in labels for label in row if found[label].count == 0)
    if empty:
        raise DeviceError(
            f"{empty} of {total} samples have no device activity in the profile "
            "(activity records lost, or a candidate that launches nothing on the device)"
        )
    return [[found[label].us for label in row] for row in labels]


def kernels_from_ranges(
    labels: Sequence[Sequence[str]], found: Mapping[str, RangeTime]
) -> list[dict[str, list[float]]]:
    """Per candidate (label rows in order): activity name -> its µs in each of the row's samples (0 where
    it did not run in a sample). Names in order of first appearance."""
    out: list[dict[str, list[float]]] = []
    for row in labels:
        names = list(dict.fromkeys(name for label in row for name in found[label].by_name))
        out.append({name: [found[label].by_name.get(name, 0.0) for label in row] for name in names})
    return out


def chrome_trace_events(prof: Any) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a finished torch.profiler session, through its Chrome-trace export."""
    with tempfile.TemporaryDirectory(prefix="tuner-trace-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8", errors="replace") as fh:
            data = json.load(fh, strict=False)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [ev for ev in events if isinstance(ev, dict)]


def _correlation(ev: Mapping[str, Any]) -> int | None:
    args = ev.get("args")
    if not isinstance(args, Mapping):
        return None
    value = args.get("correlation")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# -- NVML / nvidia-smi queries (best effort) -------------------------------------------------------
def _nvml_id(props: Any, index: int) -> str:
    """How NVML and nvidia-smi name this device: its UUID where torch knows it (CUDA and NVML may number
    devices differently), else the index."""
    uuid = getattr(props, "uuid", None)
    if uuid:
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    return str(index)


def _nvml_handle(nvml_id: str) -> tuple[Any, Any] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        if nvml_id.isdigit():
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(nvml_id))
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(nvml_id)
    except Exception:
        return pynvml, None


def _smi(field: str, nvml_id: str | None = None) -> str | None:
    """One field from nvidia-smi, for the device ``nvml_id`` (the first device when None)."""
    query = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"]
    if nvml_id is not None:
        query.insert(1, f"--id={nvml_id}")
    out = run_quiet(query)
    return out.splitlines()[0].strip() if out else None


def driver_version(nvml_id: str) -> str | None:
    """The NVIDIA driver version (one per host) from NVML (pynvml / nvidia-ml-py), else nvidia-smi; None if
    neither works."""
    found = _nvml_handle(nvml_id)
    if found is not None:
        pynvml, _ = found
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:
            pass
    return _smi("driver_version")


def sm_clock_mhz(nvml_id: str) -> int | None:
    """The current SM clock in MHz (NVML, else nvidia-smi); None if neither works."""
    found = _nvml_handle(nvml_id)
    if found is not None and found[1] is not None:
        pynvml, handle = found
        try:
            return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            pass
    text = _smi("clocks.sm", nvml_id)
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None
