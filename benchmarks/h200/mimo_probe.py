"""Probe the Mamba3 MIMO backward template on a GPU: correctness, device time per kernel, registers, spills.

A diagnostic beside the sweep (``tune_mimo.sh``): for each (workload, config) it builds and runs the template
once in a spawned process of its own (so a crash or illegal address only loses that candidate, and compiles
run in parallel across the host's cores), checks every gradient against the float32 reference, then times
the candidates that passed, one after another in this process: CUPTI kernel durations via torch.profiler,
L2 flushed before each sample, median per kernel name and of the per-sample totals.

usage: python benchmarks/h200/mimo_probe.py --workloads mimo-n64-p64-r4 ... \\
           --configs '{}' '{"variant": "fused"}' ... [--samples 20] [--workers 16] [--json OUT.json]
Each config is a JSON object of overrides of the search space's default config, or ``tilelang`` for the
comparator (mamba_ssm's TileLang backward; its errors are reported, not gated).

``--mma wgmma`` compiles the template's kernels with Triton's Hopper wgmma path allowed (the template keeps
it off: it faulted on the H200 with the first version, see bwd_launch._mma_sync_only): an experiment, one
mode per invocation (Triton's in-memory kernel cache is not keyed on the switch).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import defaultdict

TEMPLATE_NAME = "mamba3_mimo_bwd"
TILELANG = "tilelang"  # as a --configs entry: mamba_ssm's TileLang backward (timed per kernel, never gated)


def _config(overrides: str):
    from tuner import registry

    space = registry.get(TEMPLATE_NAME).space()
    return space.validate_config({**space.default.to_dict(), **json.loads(overrides)})


def _kernel_stats() -> dict[str, dict[str, int]]:
    """Registers, spills and shared memory of every compiled Triton kernel of the template's module."""
    from tuner.kernels.mamba3_mimo import bwd_kernel as kern

    stats: dict[str, dict[str, int]] = {}
    for name in ("group_local_kernel", "state_scan_kernel", "group_bwd_kernel", "chunk_values_kernel",
                 "chunk_qk_kernel", "epilogue_kernel"):
        fn = getattr(kern, name)
        for caches in getattr(fn, "device_caches", {}).values():
            cache = caches[0] if isinstance(caches, tuple) else caches
            for compiled in cache.values():
                stats[name] = {"regs": int(getattr(compiled, "n_regs", -1)),
                               "spills": int(getattr(compiled, "n_spills", -1)),
                               "shared": int(getattr(compiled.metadata, "shared", -1))}
                # what the PTX asks of ptxas (some compiles land at 32 registers)
                if name in ("group_bwd_kernel", "chunk_values_kernel", "chunk_qk_kernel"):
                    ptx = getattr(compiled, "asm", {}).get("ptx", "")
                    stats[name]["ptx"] = " ".join(
                        ln.strip() for ln in ptx.splitlines()
                        if ln.strip().startswith((".maxnreg", ".maxntid", ".reqntid", ".minnctapersm")))
    return stats


class ComparatorUnavailable(RuntimeError):
    """The TileLang comparator cannot run on this host or shape; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"comparator unavailable: {reason}")
        self.reason = reason


def build_candidate(template, shape, overrides: str):
    """The kernel of one candidate: ``"tilelang"`` names the template's comparator, anything else is a JSON
    config (overrides of the default; a whole config works too). Shared with warm_mimo.py.
    Raises ComparatorUnavailable, or what the build raises."""
    if overrides == TILELANG:
        (comparator,) = template.comparators()
        reason = comparator.unavailable(shape)
        if reason is not None:
            raise ComparatorUnavailable(reason)
        return comparator.build(shape)
    return template.build(_config(overrides), shape)


def _allow_wgmma(mma: str) -> None:
    """``wgmma``: launch the template's kernels without the DISABLE_MMA_V3 guard (this process only)."""
    if mma == "wgmma":
        import contextlib

        from tuner.kernels.mamba3_mimo import bwd_launch

        bwd_launch._mma_sync_only = contextlib.nullcontext  # type: ignore[assignment]


def _walk_launch(spec: str | None) -> None:
    """``--walk-launch JSON``: the state walk's launch settings in this process (an experiment)."""
    if spec:
        from tuner.kernels.mamba3_mimo import bwd_launch

        bwd_launch.WALK_LAUNCH = json.loads(spec)


def _check(workload: str, overrides: str, mma: str = "sync", walk: str | None = None) -> dict:
    """Build, run once, compare with the reference; never raises (the failure is the result)."""
    import torch

    _allow_wgmma(mma)
    _walk_launch(walk)

    from tuner import registry
    from tuner.measure.verify import check_outputs

    template = registry.get(TEMPLATE_NAME)
    shape = template.workload(workload)
    started = time.perf_counter()
    row: dict = {"workload": workload, "config": overrides}
    try:
        if overrides != TILELANG and not template.space().is_valid(_config(overrides), shape):
            row["status"] = "invalid for shape"
            return row
        kernel = build_candidate(template, shape, overrides)
        inputs = template.make_inputs(shape, "cuda", 1)
        outputs = template.allocate_outputs(shape, inputs)
        for v in outputs.values():
            v.fill_(float("nan"))
        kernel(inputs, outputs)
        torch.cuda.synchronize()
        row["compile_run_s"] = round(time.perf_counter() - started, 1)
        verdict = check_outputs(outputs, template.reference(shape, inputs), template.outputs)
        row["errors"] = errs = dict(verdict.errors)
        bad = {spec.name: errs[spec.name] for spec in template.outputs if not errs[spec.name] <= spec.rtol}
        wrong = ", ".join(f"{k}={e:.2e}" for k, e in bad.items())
        row["status"] = "ok" if verdict.ok or overrides == TILELANG else "wrong: " + wrong
        row["kernels"] = _kernel_stats()
    except Exception as exc:  # the probe reports every failure as a row
        row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return row


def _time(workload: str, overrides: str, samples: int, keep: dict | None = None, seed: int = 2,
          pad_mib: int = 0) -> dict[str, float]:
    """Median device time per kernel name (µs) and of the per-sample totals ('total'); ``keep``, when given,
    receives every sample (per kernel name and 'total', in sample order) for a look at the distribution.
    ``seed``: the inputs' seed; ``pad_mib``: that many MiB allocated before the inputs (the caching allocator
    emptied first, so that earlier calls' blocks do not decide where they land) and freed after the first call,
    which moves the inputs, outputs and first scratch to other addresses (a look at layout effects)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tuner import registry

    template = registry.get(TEMPLATE_NAME)
    shape = template.workload(workload)
    kernel = build_candidate(template, shape, overrides)
    torch.cuda.empty_cache()
    pad = torch.empty(pad_mib * 2**20, dtype=torch.uint8, device="cuda") if pad_mib else None
    inputs = template.make_inputs(shape, "cuda", seed)
    outputs = template.allocate_outputs(shape, inputs)
    kernel(inputs, outputs)
    torch.cuda.synchronize()
    del pad  # the inputs and outputs above stay where they are
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    per_kernel: dict[str, list[float]] = defaultdict(list)
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(samples):
            flush.zero_()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                kernel(inputs, outputs)
                torch.cuda.synchronize()
            path = os.path.join(tmp, f"{i}.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
            sums: dict[str, float] = defaultdict(float)
            for e in events:
                sums[e["name"][:40]] += e["dur"]
            for k, v in sums.items():
                per_kernel[k].append(v)
            totals.append(sum(sums.values()))
    out = {k: statistics.median(v) for k, v in per_kernel.items()}
    out["total"] = statistics.median(totals)
    if keep is not None:
        keep.update({k: list(v) for k, v in per_kernel.items()}, total=totals)
    return out


def _time_protocol(workload: str, overrides: str, samples: int, seed: int = 0,
                   case: bool = False) -> dict[str, float]:
    """Medians as :func:`_time`'s, timed as the tuner times a candidate: its CUDA backend's ``time_by_kernel``
    (10 warm-up calls, then every sample back to back in one profiler session, the contract's flush of twice
    the L2 before each; memcpy and memset activities counted beside kernels), with the inputs of ``seed``;
    ``case``: inputs, reference and poisoned outputs made as the measuring process makes them
    (``child.fresh_case``), the reference kept."""
    import torch

    from tuner import registry
    from tuner.measure.child import fresh_case, kernel_medians
    from tuner.measure.devices.cuda import backend_from_env

    template = registry.get(TEMPLATE_NAME)
    shape = template.workload(workload)
    kernel = build_candidate(template, shape, overrides)
    backend = backend_from_env(0)
    if case:
        inputs, _reference, outputs = fresh_case(template, shape, backend, seed)
    else:
        inputs = template.make_inputs(shape, "cuda", seed)
        outputs = template.allocate_outputs(shape, inputs)
    kernel(inputs, outputs)
    torch.cuda.synchronize()
    timing = backend.time_by_kernel([lambda: kernel(inputs, outputs)], n_samples=samples, warmup=10)
    out: dict[str, float] = defaultdict(float)
    for name, us in kernel_medians(timing.kernels[0]).items():
        out[name[:40]] += us  # names cut as _time cuts them, summed where two share their first 40 characters
    out = dict(out)
    out["total"] = statistics.median(timing.samples[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="+", required=True)
    ap.add_argument("--configs", nargs="+", default=["{}"])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=400.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2],
                    help="time each passing candidate once per inputs seed (a look at data effects)")
    ap.add_argument("--pad-mib", type=int, nargs="+", default=[0],
                    help="and once per padding allocated before its inputs (a look at address effects)")
    ap.add_argument("--protocol", action="store_true",
                    help="also time each candidate as the tuner does (its backend's time_by_kernel)")
    ap.add_argument("--per-sample", action="store_true",
                    help="keep every sample's per-kernel times in the JSON rows ('samples'), not only medians")
    ap.add_argument("--mma", choices=("sync", "wgmma"), default="sync",
                    help="wgmma: allow Triton's Hopper wgmma path in the template's kernels (an experiment)")
    ap.add_argument("--walk-launch", default=None,
                    help='JSON launch settings of the state walk, e.g. \'{"num_warps": 4}\' (an experiment)')
    args = ap.parse_args()
    _allow_wgmma(args.mma)
    _walk_launch(args.walk_launch)
    jobs = [(w, c) for w in args.workloads for c in args.configs]
    rows: list[dict] = []
    started = time.perf_counter()
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_check, w, c, args.mma, args.walk_launch) for w, c in jobs]
        try:
            for future in cf.as_completed(futures, timeout=args.timeout):
                row = future.result()
                rows.append(row)
                print(f"{time.perf_counter() - started:6.1f}s {row['workload']:18s} {row['config']:60.60s} "
                      f"{row['status'][:90]} {json.dumps(row.get('kernels', {}))}", flush=True)
        except cf.TimeoutError:
            print("check phase timed out; timing what passed", flush=True)
            for p in pool._processes.values():
                p.kill()
    for row in rows:
        if row["status"] == "ok" or row["status"].startswith("wrong"):  # a wrong result is timed too
            try:
                keep: dict | None = {} if args.per_sample else None
                variants = [(s, p) for s in args.seeds for p in args.pad_mib]
                row["us"] = _time(row["workload"], row["config"], args.samples, keep, *variants[0])
                if keep is not None:
                    row["samples"] = keep
                if args.protocol:
                    row.setdefault("variants", {}).update({
                        f"tuner protocol, seed {args.seeds[0]}": _time_protocol(
                            row["workload"], row["config"], args.samples, args.seeds[0]),
                        f"same, fresh_case, seed {args.seeds[0]}": _time_protocol(
                            row["workload"], row["config"], args.samples, args.seeds[0], case=True)})
                if len(variants) > 1:  # the same candidate on other inputs / at other addresses (the first
                    # variant again, after the others' allocations: the row's own figure came first)
                    row.setdefault("variants", {}).update({
                        f"seed={s} pad_mib={p}": _time(row["workload"], row["config"], args.samples, None, s, p)
                        for s, p in variants})
            except Exception as exc:
                row["status"] = f"timing failed: {type(exc).__name__}: {exc}"[:200]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'workload':18s} {'config':58s} {'total µs':>10s}  per kernel (µs) / status")
    for row in sorted(rows, key=lambda r: (r["workload"], r["config"])):
        if "us" in row:
            parts = " ".join(f"{k.split('_kernel')[0][-14:]}={v:.0f}" for k, v in row["us"].items() if k != "total")
            worst = max(row["errors"].values())
            total = row["us"]["total"]
            print(f"{row['workload']:18s} {row['config']:58.58s} {total:10.1f}  {parts} maxerr={worst:.1e}")
        else:
            print(f"{row['workload']:18s} {row['config']:58.58s} {'-':>10s}  {row['status'][:100]}")
        for name, us in row.get("variants", {}).items():
            parts = " ".join(f"{k.split('_kernel')[0][-14:]}={v:.0f}" for k, v in us.items() if k != "total")
            print(f"{'':18s} {name:>58s} {us['total']:10.1f}  {parts}")


if __name__ == "__main__":
    main()
