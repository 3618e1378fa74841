"""Which NVIDIA GPUs this process may use, and how to pin a child process to exactly one of them.

A worker pinned to a GPU runs with ``CUDA_VISIBLE_DEVICES`` naming only that GPU, set before anything in the
process imports CUDA: its CUDA context, its measurement subprocesses and its compile pool (which inherit the
environment) can then reach no other GPU, and inside it the GPU is ``cuda:0``. The GPUs are listed with
``nvidia-smi`` (the parent never creates a CUDA context) and filtered by the parent's own
``CUDA_VISIBLE_DEVICES`` as the CUDA runtime does: entries are indices or UUIDs (or unique UUID prefixes),
and the list ends at the first entry that names no GPU.

Pure functions over a listing (:func:`visible_gpus`, :func:`pinned_env`) carry the logic; only
:func:`list_nvidia_gpus` runs a command. Everything here is immutable and thread-safe.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.errors import DeviceError

NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader")


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as the driver numbers it (``nvidia-smi``'s index)."""

    index: int
    uuid: str  # "GPU-…"
    name: str


@dataclass(frozen=True)
class VisibleGpu:
    """A GPU this process sees: ``ordinal`` is its CUDA index here (``cuda:N``); ``selector`` is what a
    child's ``CUDA_VISIBLE_DEVICES`` holds to see only it (its UUID: stable whatever the numbering)."""

    ordinal: int
    physical: PhysicalGpu

    @property
    def selector(self) -> str:
        return self.physical.uuid


def parse_nvidia_smi(text: str) -> list[PhysicalGpu]:
    """The GPUs of ``nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader`` output.
    Raises DeviceError on a line that is not ``index, uuid, name``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        index, sep, rest = line.partition(",")
        uuid, sep2, name = rest.partition(",")
        if not (sep and sep2 and index.strip().isdigit() and uuid.strip()):
            raise DeviceError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(PhysicalGpu(int(index), uuid.strip(), name.strip()))
    return gpus


def list_nvidia_gpus(timeout_s: float = 30.0) -> list[PhysicalGpu]:
    """Every GPU of this host by ``nvidia-smi``; DeviceError when it cannot be run or fails."""
    try:
        done = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceError(f"cannot list the GPUs with nvidia-smi: {exc}") from None
    if done.returncode != 0:
        raise DeviceError(f"nvidia-smi failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return parse_nvidia_smi(done.stdout)


def visible_gpus(physical: Sequence[PhysicalGpu], environ: Mapping[str, str]) -> list[VisibleGpu]:
    """The GPUs a process with ``environ`` sees, in CUDA order. Without ``CUDA_VISIBLE_DEVICES`` all of
    them by index; with it, the GPUs its entries name, in their order, up to the first entry that names none
    (an index out of range, an unknown or ambiguous UUID prefix: CUDA ignores the rest); a GPU named twice
    ends the list too."""
    selection = environ.get("CUDA_VISIBLE_DEVICES")
    if selection is None:
        chosen = sorted(physical, key=lambda g: g.index)
    else:
        chosen = []
        for entry in (e.strip() for e in selection.split(",")):
            gpu = _named(physical, entry)
            if gpu is None or gpu in chosen:
                break
            chosen.append(gpu)
    return [VisibleGpu(i, g) for i, g in enumerate(chosen)]


def _named(physical: Sequence[PhysicalGpu], entry: str) -> PhysicalGpu | None:
    if entry.isdigit():
        return next((g for g in physical if g.index == int(entry)), None)
    if not entry:
        return None
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    matches = [g for g in physical if g.uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def pinned_env(gpu: VisibleGpu) -> dict[str, str]:
    """Environment variables that pin a child process (and everything it starts) to ``gpu``; inside it the
    GPU is ``cuda:0``."""
    return {"CUDA_VISIBLE_DEVICES": gpu.selector}
