"""One worker per visible GPU of this host (``tuner worker --all-gpus``, ``tuner serve --workers auto``).

The supervisor lists the GPUs this process may use (:mod:`tuner.measure.devices.gpus`: ``nvidia-smi``
filtered by ``CUDA_VISIBLE_DEVICES``, no CUDA context here) and starts one ``tuner worker`` child per GPU,
pinned to it: the child's ``CUDA_VISIBLE_DEVICES`` names that GPU alone, so its CUDA context, its measurement
subprocesses and its compile pool run on it only; inside the child it is ``cuda:0`` and the worker
registers (and records with each measurement) the GPU's index on the host. The workers share jobs, studies
and bests through the store as workers on several hosts do: the study key names the device model, not
the GPU. The supervisor forwards SIGINT/SIGTERM to the children and waits for them (a child leaves after
its current trial); it exits when every child has.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.errors import DeviceError
from tuner.measure.devices.gpus import VisibleGpu, pinned_env

log = logging.getLogger(__name__)
STOP_GRACE_S = 60.0


@dataclass(frozen=True)
class WorkerLaunch:
    """How one pinned worker is started. Immutable."""

    gpu: VisibleGpu
    argv: tuple[str, ...]
    env: Mapping[str, str]


def plan_fleet(
    gpus: Sequence[VisibleGpu], worker_args: Sequence[str], environ: Mapping[str, str]
) -> list[WorkerLaunch]:
    """One launch per GPU: ``tuner worker --device cuda --index 0 --registered-index N`` plus ``worker_args``,
    in ``environ`` pinned to the GPU. DeviceError when there is no GPU to run on."""
    if not gpus:
        raise DeviceError("no GPU is visible to this process (nvidia-smi, CUDA_VISIBLE_DEVICES)")
    return [
        WorkerLaunch(
            gpu,
            (sys.executable, "-m", "tuner.cli", "worker", "--device", "cuda", "--index", "0",
             "--registered-index", str(gpu.ordinal), *worker_args),
            {**environ, **pinned_env(gpu)},
        )
        for gpu in gpus
    ]


def run_fleet(launches: Sequence[WorkerLaunch], stop: threading.Event, grace_s: float = STOP_GRACE_S) -> int:
    """Start every launch and wait until all children exit; when ``stop`` is set, ask them to stop (SIGTERM)
    and kill those still running after ``grace_s``. Returns 0 if every child exited with 0, else the first
    non-zero exit code."""
    from tuner.service.serve import die_with_parent, stop_worker

    children = []
    for launch in launches:
        child = subprocess.Popen(list(launch.argv), env=dict(launch.env), preexec_fn=die_with_parent)
        log.info("worker pid %d on GPU %d (%s, %s)", child.pid, launch.gpu.ordinal, launch.gpu.physical.uuid,
                 launch.gpu.physical.name)
        children.append(child)
    try:
        while any(c.poll() is None for c in children) and not stop.wait(1.0):
            pass
    finally:
        for child in children:  # all at once: they leave after their current trials in parallel
            if child.poll() is None:
                child.terminate()
        codes = [stop_worker(child, grace_s) for child in children]
    return next((code for code in codes if code), 0)
