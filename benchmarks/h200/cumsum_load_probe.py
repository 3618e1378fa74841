"""Probe: how the chunk cumsum's one-tile TileLang kernel should bring ``dt`` in (the plan's ``load``).

The served kernels load ``dt`` fused with the activation: each thread reads one float at a time, adds the
bias, applies the softplus (a branch) and stages the value; the branch keeps the loads scalar (16 per thread
at 8 heads and 128 threads). ``load`` (kernels/mamba2_chunk_cumsum/tilelang_program.py, a plan-level field,
not yet a search-space parameter) gives two other paths:

  regs   the raw tile is copied into registers first with vector loads (4 float4 per thread at 8 heads,
         128 threads), then activated and staged from there (no extra shared memory, no extra barrier)
  copy   the raw tile is copied into shared memory first (vector loads, one more barrier and 8 KB more
         shared memory per CTA at 8 heads), then activated into the stage

For each case (a shape and a config: the served best), every ``--load`` x ``--min-blocks`` variant of the
config is compiled, checked against the float64 reference on NaN-poisoned outputs, and timed interleaved
in one process with mamba_ssm as users call it (its wrapper, fp32 outputs, its autotuner; and its kernel at
each fixed BLOCK_SIZE_H as the wrapper launches it) and the elementwise kernel of the same bytes (the
ceiling), under the timing contract (CUPTI, L2 flushed by zero_() before every sample, median of
``--samples``), ``--rounds`` times.

usage: python benchmarks/h200/cumsum_load_probe.py --case 'B=2,S=32768,H=80,has_bias=true,dtype=float32|{json}'
       [--case ...] [--load fused --load regs --load copy] [--min-blocks N ...] [--samples 100] [--rounds 2]
       [--json OUT] [--md OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any


def _variants(template: Any, shape: Any, overrides: dict, loads: list[str], min_blocks: list[int]) -> dict:
    """label -> plan, for each (load, min_blocks) that is valid for the shape."""
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import plan_for

    config = template.space().default.replace(**overrides)
    plans = {}
    for mb in [int(config["min_blocks"]), *[m for m in min_blocks if m != int(config["min_blocks"])]]:
        cfg = config.replace(min_blocks=mb)
        if template.space().check(cfg, shape):
            continue
        for load in loads:
            plans[f"{load} mb{mb}"] = dataclasses.replace(plan_for(cfg, shape), load=load)
    return plans


def _checked(name: str, fn: Any, template: Any, shape: Any, inputs: Any, gated: bool = True) -> Any:
    """fn's own poisoned outputs after one checked run; SystemExit when they are wrong."""
    import torch

    from tuner.measure.verify import check_outputs, poison_

    reference = template.reference(shape, inputs)
    outputs = template.allocate_outputs(shape, inputs)
    for out_name, out in outputs.items():
        poison_(out, reference[out_name])
    returned = fn(inputs, outputs)  # mamba_ssm's wrapper returns its own outputs
    torch.cuda.synchronize()
    if isinstance(returned, dict):
        outputs = returned
    if gated:
        verdict = check_outputs(outputs, reference, template.output_specs(shape))
        if not verdict.ok:
            raise SystemExit(f"{name} on {shape.key()}: {verdict.failure}")
    return outputs


def measure_case(backend: Any, template: Any, spec: str, loads: list[str], min_blocks: list[int],
                 samples: int, rounds: int) -> dict[str, Any]:
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import _compile, _launcher
    from tuner.kernels.tilelang_toolchain import resolve_toolchain

    shape_text, _, config_text = spec.partition("|")
    dims = {}
    for item in shape_text.split(","):
        key, _, value = item.partition("=")
        dims[key] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    shape = template.make_shape(dims)
    plans = _variants(template, shape, json.loads(config_text or "{}"), loads, min_blocks)
    toolchain = resolve_toolchain()
    launchers: dict[str, Any] = {}
    kept = []  # compiled kernels, inputs and outputs live until the timing is done
    with tempfile.TemporaryDirectory() as home:
        inputs = template.make_inputs(shape, "cuda", 0)
        for name, plan in plans.items():
            fn = _launcher(_compile(plan, toolchain, Path(home) / name.replace(" ", "_")), plan, "cuda")
            outputs = _checked(name, fn, template, shape, inputs)
            kept.append((fn, outputs))
            launchers[name] = (lambda k, o: lambda: k(inputs, o))(fn, outputs)
        for comparator in template.comparators():
            if comparator.variant:
                continue  # the TileOPs-contract lines: issue 16 measures against mamba_ssm as users call it
            at = comparator.contract_shape(shape)
            if comparator.unavailable(at) is not None:
                continue
            at_inputs = inputs if at == shape else template.make_inputs(at, "cuda", 0)
            fn = comparator.build(at)
            outputs = _checked(comparator.name, fn, template, at, at_inputs, gated=comparator.gated)
            kept.append((fn, outputs, at_inputs))
            launchers[comparator.name] = (lambda k, i, o: lambda: k(i, o))(fn, at_inputs, outputs)
        names = list(launchers)
        per_round = []
        for _ in range(rounds):
            timing = backend.time([launchers[n] for n in names], n_samples=samples, warmup=10)
            per_round.append({n: statistics.median(s) for n, s in zip(names, timing, strict=True)})
    return {"shape": shape.key(), "config": json.loads(config_text or "{}"), "rounds": per_round,
            "variants": list(plans), "device": backend.device_name if hasattr(backend, "device_name") else None}


def table(cases: list[dict[str, Any]]) -> str:
    """Per case and round: each variant's µs, the strongest mamba_ssm line as users call it over it, and
    its share of the fastest ceiling line."""
    out = ["| shape | round | variant | µs | strongest mamba_ssm line as users call it | ratio "
           "| % of elementwise kernel |", "|---|---|---|---|---|---|---|"]
    for case in cases:
        for i, medians in enumerate(case["rounds"], 1):
            users = {n: t for n, t in medians.items() if n.startswith("mamba_ssm")}
            ceiling = min((t for n, t in medians.items() if n.startswith("ceiling")), default=None)
            rival = min(users, key=users.__getitem__) if users else None
            for v in case["variants"]:
                t = medians[v]
                ratio = f"{users[rival] / t:.3f}x" if rival else "–"
                share = f"{ceiling / t:.1%}" if ceiling else "–"
                line = f"{rival} {users[rival]:.2f}" if rival else "–"
                out.append(f"| {case['shape']} | {i} | {v} | {t:.2f} | {line} | {ratio} | {share} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", required=True, help="'SHAPE|CONFIG JSON' (overrides of the default)")
    parser.add_argument("--load", action="append", choices=("fused", "regs", "copy"), default=[])
    parser.add_argument("--min-blocks", action="append", type=int, default=[])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()

    import torch

    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang
    from tuner.measure.devices.cuda import CudaBackend

    backend = CudaBackend(0)
    template = Mamba2ChunkCumsumTileLang()
    loads = args.load or ["fused", "regs", "copy"]
    cases = []
    for spec in args.case:
        cases.append(measure_case(backend, template, spec, loads, args.min_blocks, args.samples, args.rounds))
        cases[-1]["device"] = torch.cuda.get_device_name(0)
        print(table(cases[-1:]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(cases, indent=1))
    if args.md:
        Path(args.md).write_text(table(cases) + "\n")


if __name__ == "__main__":
    main()
