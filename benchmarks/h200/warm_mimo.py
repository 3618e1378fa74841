"""Fill the compile caches for the Mamba3 MIMO backward benchmark, in parallel across the host's cores.

mamba_ssm's TileLang backward takes minutes to compile per shape and the Triton template's kernels tens of
seconds per config; compiled serially inside the sweep they would dominate it. This script builds and runs
once, in a pool of spawned processes (one GPU context each), every candidate the sweep will measure first:
the TileLang comparator and the template's default and seed configs, for every official workload. The
sweep (`tuner tune mamba3_mimo_bwd …`) then loads them from TileLang's and Triton's on-disk caches.

With ``--best-db URL`` it builds, instead of the default and seeds, every config the lookup serves for each
shape from that store (the current template version's bests, else a carried version's, completed: what
``tuner verify`` re-measures, or a final round runs beside its finalists), beside the TileLang comparator.

With ``--comparator-only`` it builds the TileLang comparator alone (a sweep that continues a study whose default
and seeds are measured already needs only the comparator of its final round); with ``--no-comparator`` the
template's configs alone (``tuner verify --no-comparators`` of the published bests).

usage: python benchmarks/h200/warm_mimo.py [--workers 16] [--timeout 420] [--workloads NAME ...] [--best-db URL]
       [--comparator-only | --no-comparator]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import os
import time


def _warm(workload: str, candidate: str) -> tuple[str, str, float, str]:
    import torch
    from mimo_probe import ComparatorUnavailable, build_candidate  # this script's folder is on sys.path

    from tuner import registry

    template = registry.get("mamba3_mimo_bwd")
    shape = template.workload(workload)
    started = time.perf_counter()
    try:
        try:
            kernel = build_candidate(template, shape, candidate)
        except ComparatorUnavailable as exc:
            return workload, candidate, 0.0, f"unavailable: {exc.reason}"
        inputs = template.make_inputs(shape, "cuda", 0)
        kernel(inputs, template.allocate_outputs(shape, inputs))
        torch.cuda.synchronize()
        status = "ok"
    except Exception as exc:  # a candidate that fails here fails in the sweep too, with its reason
        status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return workload, candidate, time.perf_counter() - started, status


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=420.0)
    ap.add_argument("--workloads", nargs="*", default=None, help="default: every official workload")
    ap.add_argument("--best-db", default=None, help="warm each shape's published best in this store instead")
    ap.add_argument("--comparator-only", action="store_true", help="warm the TileLang comparator alone")
    ap.add_argument("--no-comparator", action="store_true", help="warm the template's configs alone")
    args = ap.parse_args()
    from tuner import db, registry

    template = registry.get("mamba3_mimo_bwd")
    space = template.space()
    names = [w.name for w in template.workloads if not args.workloads or w.name in args.workloads]
    # Every TileLang build first (150-250 s each): queued behind the Triton builds (15-60 s each) they would
    # start late and finish last.
    jobs = [] if args.no_comparator else [(name, "tilelang") for name in names]
    store = db.Store.open(args.best_db) if args.best_db else None
    served: dict[str, set[str]] = {}  # shape key -> configs served there: this version's, else a carried one's
    if store is not None:
        from tuner.frozen import Config
        from tuner.store.entries import served_entries

        for record, entry in served_entries(store, template=template.name, version=template.version,
                                            carries=template.spec.carries, device_kind="cuda"):
            served.setdefault(record.shape_key, set()).add(Config(dict(entry.config)).to_json())
    for name in [] if args.comparator_only else names:
        shape = template.workload(name)
        if store is not None:  # every served best of the shape (few): which one verify picks depends on the host
            jobs += [(name, config) for config in sorted(served.get(shape.key(), ()))]
            continue
        jobs += [(name, c.to_json()) for c in (space.default, *space.seeds) if space.is_valid(c, shape)]
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = [pool.submit(_warm, w, c) for w, c in jobs]
        try:
            for future in cf.as_completed(futures, timeout=args.timeout):
                workload, candidate, seconds, status = future.result()
                print(f"{time.perf_counter() - started:7.1f}s {workload:22s} {seconds:6.1f}s {status:10.60s} "
                      f"{candidate}", flush=True)
        except cf.TimeoutError:
            # Leaving the pool would wait for the unfinished builds and eat the sweep's time: stop them.
            left = sum(not f.done() for f in futures)
            print(f"{time.perf_counter() - started:7.1f}s timeout: {left} builds stopped unfinished", flush=True)
            for process in list(pool._processes.values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main()
