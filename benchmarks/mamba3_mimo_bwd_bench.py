"""Quick H200 check of the Mamba3 MIMO backward template against mamba_ssm's TileLang backward.

For each official workload: correctness of a few configs and of TileLang against the float32 reference
(relative L2 per gradient), then device time per backward (CUPTI kernel durations via torch.profiler, L2
flushed before every sample, median of N), interleaved between candidates. Standalone: it does not use the
tuner's measurer or store. Usage::

    python benchmarks/mamba3_mimo_bwd_bench.py [--workloads mimo-n128-p64-r4 ...] [--samples 30]
        [--configs '{"variant": "fused"}' ...]     # overrides of the default config, one JSON per config
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from kernels.mamba3_mimo_bwd import Mamba3MimoBwd

DEFAULT_OVERRIDES = [
    '{}', '{"variant": "fused"}', '{"variant": "grouped", "group_chunks": 4}',
    '{"variant": "grouped", "group_chunks": 16}', '{"chunk_rows": 32}', '{"chunk_rows": 128}',
    '{"prec": "lowp3"}', '{"num_warps": 4}', '{"num_warps": 16}', '{"block_n": 32}',
]


def _device_us(kernel, inputs, outputs, samples: int) -> float:
    """Median over samples of the summed CUDA kernel durations of one call, L2 flushed before each."""
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    per_call = []
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
                events = json.load(f)["traceEvents"]
            per_call.append(sum(e["dur"] for e in events if e.get("cat") == "kernel"))
    return statistics.median(per_call)


def main() -> None:
    tpl = Mamba3MimoBwd()
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="*", default=[w.name for w in tpl.workloads])
    ap.add_argument("--configs", nargs="*", default=DEFAULT_OVERRIDES)
    ap.add_argument("--samples", type=int, default=30)
    args = ap.parse_args()
    space = tpl.space()
    (cmp,) = tpl.comparators()
    bounds = {o.name: o.rtol for o in tpl.outputs}
    ratios = []
    for name in args.workloads:
        shape = tpl.workload(name)
        inputs = tpl.make_inputs(shape, "cuda", 0)
        refs = tpl.reference(shape, inputs)
        cands = {}
        for text in args.configs:
            config = space.validate_config({**space.default.to_dict(), **json.loads(text)})
            why = space.check(config, shape)
            if why is None:
                cands[text] = tpl.build(config, shape)
            else:
                print(f"{name} {text}: invalid ({why})")
        reason = cmp.unavailable(shape)
        if reason is None:
            cands["tilelang"] = cmp.build(shape)
        else:
            print(f"{name} tilelang: unavailable ({reason})")
        times = {}
        for label, kernel in cands.items():
            outs = tpl.allocate_outputs(shape, inputs)
            try:
                kernel(inputs, outs)  # compile and warm up
                torch.cuda.synchronize()
            except Exception as exc:  # report and go on with the other candidates
                print(f"{name} {label}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                continue
            errs = {k: float((outs[k].double() - refs[k].double()).norm() / refs[k].double().norm())
                    for k in refs}
            bad = {k: f"{e:.1e}" for k, e in errs.items() if e > bounds[k]}
            worst = max(errs, key=lambda k: errs[k] / bounds[k])
            times[label] = _device_us(kernel, inputs, outs, args.samples)
            print(f"{name} {label}: {times[label]:9.1f} us  worst {worst}={errs[worst]:.1e}"
                  + (f"  OVER BOUND {bad}" if bad else ""))
        ours = [t for k, t in times.items() if k != "tilelang"]
        if ours and "tilelang" in times:
            ratios.append(times["tilelang"] / min(ours))
            print(f"{name}: best template {min(ours):.1f} us, TileLang {times['tilelang']:.1f} us, "
                  f"speedup {ratios[-1]:.2f}x")
    if ratios:
        geomean = math.exp(statistics.fmean(map(math.log, ratios)))
        print(f"geomean speedup over {len(ratios)} shapes: {geomean:.2f}x")


if __name__ == "__main__":
    main()
