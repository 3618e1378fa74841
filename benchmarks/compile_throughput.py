"""Parallel against serial compilation of a template's candidates (issue 4: TileLang compile throughput).

Samples ``--configs`` distinct valid configs of a template for one workload (the sampler the sweep uses
would pick the same kind of points), then compiles them twice into fresh, empty compile caches: once in
this process one after another (``workers=1``), once with ``tuner.measure.compile_cache.precompile`` across
``--workers`` spawned processes, the way the tuner compiles a batch of trials. Prints both wall times,
configs per second and the speed-up, and writes them as JSON with ``--json``.

usage: python benchmarks/compile_throughput.py mamba2_chunk_cumsum_tilelang --workload NAME \\
           [--configs 32] [--workers 16] [--seed 0] [--json OUT.json]
On a CPU-only host the TileLang template compiles for its C target (float32 workloads only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--configs", type=int, default=32)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from tuner import registry
    from tuner.measure.compile_cache import CompileCache, precompile

    template = registry.get(args.template)
    shape = template.workload(args.workload)
    space = template.space()
    rng = random.Random(args.seed)
    configs = []
    seen = set()
    for _ in range(50 * args.configs):
        config = space.sample(rng, shape)
        if config not in seen:
            seen.add(config)
            configs.append(config)
            if len(configs) == args.configs:
                break
    results = {}
    for label, workers in (("serial", 1), ("parallel", args.workers)):
        with tempfile.TemporaryDirectory(prefix=f"compile-{label}-") as root:
            started = time.perf_counter()
            outcome = precompile(template, configs, shape, workers=workers, cache=CompileCache(Path(root)))
            seconds = time.perf_counter() - started
        failed = sum(v is not None for v in outcome.values())
        results[label] = {"workers": workers, "seconds": round(seconds, 2), "failed": failed,
                          "configs_per_s": round(len(configs) / seconds, 3)}
        print(f"{label:8s} workers={workers:3d}  {seconds:8.1f} s  {len(configs) / seconds:6.2f} configs/s  "
              f"({failed} failed)", flush=True)
    speedup = results["serial"]["seconds"] / results["parallel"]["seconds"]
    print(f"speed-up: {speedup:.2f}x with {args.workers} workers on {os.cpu_count()} cores, "
          f"{len(configs)} configs of {args.template} for {args.workload}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "template": args.template, "workload": args.workload, "configs": len(configs),
            "host": platform.node(), "cores": os.cpu_count(), "results": results, "speedup": round(speedup, 3),
        }, indent=1))


if __name__ == "__main__":
    main()
