"""Measure precompile()'s speed-up over serial compilation (a script, not a test).

    TUNER_TILELANG_TARGET=cuda:sm_90 python tests/tilelang/precompile_speedup.py --configs 12 --workers 2

Draws N valid configs of one workload, compiles them serially (in this process) and with N workers (spawned
processes), each into an empty kernel cache, and prints both wall times, the speed-up and any failures.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang
from tuner.measure.compile_cache import CompileCache, precompile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="mamba2-2p7b-b2-s32k-dt-bias")
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    template = Mamba2ChunkCumsumTileLang()
    shape = template.workload(args.workload)
    space = template.space()
    rng = random.Random(args.seed)
    configs = list(dict.fromkeys(space.sample(rng, shape) for _ in range(args.configs)))
    timings = {}
    for label, workers in (("parallel", args.workers), ("serial", 1)):
        with tempfile.TemporaryDirectory() as root:
            cpu0, start = _cpu_seconds(), time.perf_counter()
            results = precompile(template, configs, shape, workers=workers, cache=CompileCache(root))
            timings[label] = time.perf_counter() - start
            cpu = _cpu_seconds() - cpu0
        failed = {c.key(): e for c, e in results.items() if e is not None}
        print(
            f"{label}: {len(configs)} configs, workers={workers}: {timings[label]:.1f} s wall, "
            f"{cpu:.1f} s CPU (this process, its workers and compilers), failed: {len(failed)}, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        for key, error in failed.items():
            print(f"  {key}: {error[:300]}")
    print(f"speed-up: {timings['serial'] / timings['parallel']:.2f}x")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
