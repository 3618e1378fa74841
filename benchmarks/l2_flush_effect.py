"""How much of the chunk cumsum's time under the timing contract is the L2 flush's write-back debt.

The contract (../shared/measuring.md) flushes L2 before every sample by zeroing a buffer of twice its size.
That leaves L2 full of *dirty* lines: every line a kernel then brings into L2 (its reads, and its writes,
which L2 allocates) evicts one of them, and the eviction writes it back to DRAM while the kernel runs. A
memory-bound kernel therefore pays for about twice its own traffic. This script measures that debt on the
five workloads for three implementations of the same bytes, under three flushes, CUPTI device time, median
of N interleaved samples (the tuner's CUDA backend):

  flushes   zero   the contract: zero_() of a buffer >= 2x L2 before each sample (L2 full of dirty lines)
            clean  the same, then a read of a second such buffer (L2 full of clean lines: cold, no debt)
            none   no flush (whatever the previous sample left in L2)
  lines     tilelang   the TileLang template at each --config (JSON overrides of its default config, the
                       tuned best on most rows of benchmarks/h200/chunk_cumsum.md; default: that config)
            mamba_ssm  the best of mamba_ssm's kernel at fixed BLOCK_SIZE_H 1/2/4/8/16 on our buffers (the
                       TileOPs-contract variant lines; per flush)
            copy       torch's device copy of bytes_moved/2 bytes (reads + writes = the operator's minimum
                       bytes, 10*B*S*H): what the memory system gives a plain copy of the same bytes

usage: python benchmarks/l2_flush_effect.py [--samples 100] [--config JSON ...] [--shape B=..,S=.. ...]
       [--flush zero ...] [--jobs 16] [--json OUT]
``--shape`` (repeatable) measures those shapes instead of the five workloads; ``--flush`` (repeatable) only
those flushes.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FLUSHES = ("zero", "clean", "none")


def _flushes(backend: Any) -> dict[str, Callable[[], None]]:
    import torch

    contract = backend.flush_l2
    reread = torch.empty(backend.flush_bytes // 4, dtype=torch.float32, device=backend.torch_device).fill_(1.0)

    def clean() -> None:
        contract()
        torch.amax(reread)  # evicts the dirty zeros (written back now, outside the sample)

    return {"zero": contract, "clean": clean, "none": lambda: None}


def _lines(template: Any, shape: Any, configs: dict[str, Any], label: str) -> dict[str, Callable[[], None]]:
    """name -> zero-argument launcher, each on its own poisoned outputs, checked once against the
    reference (a wrong kernel is not timed)."""
    import torch

    from tuner.measure.verify import check_outputs, poison_

    inputs = template.make_inputs(shape, "cuda", 0)
    reference = template.reference(shape, inputs)
    kernels = {name: template.build(config, shape) for name, config in configs.items()}
    for comparator in template.comparators():  # mamba_ssm's fixed BLOCK_SIZE_H lines on our buffers
        if comparator.variant and "-bh" in comparator.name and comparator.unavailable(shape) is None:
            kernels[comparator.name] = comparator.build(shape)
    launchers: dict[str, Callable[[], None]] = {}
    for name, kernel in kernels.items():
        outputs = template.allocate_outputs(shape, inputs)
        for out_name, out in outputs.items():
            poison_(out, reference[out_name])
        kernel(inputs, outputs)
        torch.cuda.synchronize()
        verdict = check_outputs(outputs, reference, template.output_specs(shape))
        if not verdict.ok:
            raise SystemExit(f"{name} on {label}: {verdict.failure}")
        launchers[name] = (lambda k, o: lambda: k(inputs, o))(kernel, outputs)
    half = template.bytes_moved(shape) // 2
    src = torch.rand(half // 4, device="cuda")
    dst = torch.empty_like(src)
    launchers["copy"] = lambda: dst.copy_(src)
    return launchers


def measure(samples: int, overrides: list[str], shapes: Sequence[str] = (),
            flushes: Sequence[str] = FLUSHES, jobs: int = 1) -> list[dict[str, Any]]:
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang
    from tuner.measure.devices.cuda import CudaBackend
    from tuner.shapes import select_shapes

    backend = CudaBackend(0)
    template = Mamba2ChunkCumsumTileLang()
    space = template.space()
    configs = {
        f"tilelang {o}": space.validate_config({**space.default.to_dict(), **json.loads(o)}) for o in overrides
    }
    flush_fns = _flushes(backend)
    rows = []
    selected = select_shapes(template, shapes=shapes, all_workloads=not shapes)  # (label, shape) pairs
    if jobs > 1:  # the TileLang builds in parallel processes, into the compile cache that _lines then loads from
        from tuner.measure.compile_cache import precompile

        for label, shape in selected:
            for config, error in precompile(template, configs.values(), shape, workers=jobs).items():
                if error is not None:
                    raise SystemExit(f"{config.to_json()} on {label}: {error}")
    for label, shape in selected:
        launchers = _lines(template, shape, configs, label)
        names = list(launchers)
        for flush in flushes:
            backend.flush_l2 = flush_fns[flush]  # type: ignore[method-assign]
            timing = backend.time([launchers[n] for n in names], n_samples=samples, warmup=10)
            medians = {n: statistics.median(s) for n, s in zip(names, timing, strict=True)}
            fixed = {n: t for n, t in medians.items() if n.startswith("mamba_ssm")}
            best_fixed = min(fixed, key=fixed.__getitem__) if fixed else None
            rows.append({
                "workload": label, "bytes": template.bytes_moved(shape), "flush": flush,
                "tilelang_us": {n: medians[n] for n in configs}, "copy_us": medians["copy"],
                "mamba_ssm_us": fixed[best_fixed] if best_fixed else None, "mamba_ssm_line": best_fixed,
                "all_us": medians,
            })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per (workload, flush), each TileLang config's time and the copy and mamba_ssm ratios to
    the fastest of them."""
    names = list(rows[0]["tilelang_us"]) if rows else []
    out = [
        "| workload | MB | flush | " + " | ".join(f"`{n}` µs" for n in names) + " | mamba_ssm best fixed µs | "
        "copy of the same bytes µs | copy / fastest TileLang | mamba_ssm / fastest TileLang |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|---|",
    ]
    for r in rows:
        fastest = min(r["tilelang_us"].values())
        ms = f"{r['mamba_ssm_us']:.2f} ({r['mamba_ssm_line']})" if r["mamba_ssm_us"] else "–"
        ratio = f"{r['mamba_ssm_us'] / fastest:.2f}x" if r["mamba_ssm_us"] else "–"
        times = " | ".join(f"{r['tilelang_us'][n]:.2f}" for n in names)
        out.append(
            f"| {r['workload']} | {r['bytes'] / 1e6:.1f} | {r['flush']} | {times} | {ms} | "
            f"{r['copy_us']:.2f} | {r['copy_us'] / fastest:.2f} | {ratio} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--config", action="append", default=[], help="JSON overrides of the TileLang "
                        "template's default config (repeat for several; default: one, the default config)")
    parser.add_argument("--shape", action="append", default=[], help="an explicit shape, e.g. B=2,S=32768,"
                        "H=80,has_bias=true,dtype=float32 (repeat for several; default: the five workloads)")
    parser.add_argument("--flush", action="append", choices=FLUSHES, default=[], help="only this flush (repeat)")
    parser.add_argument("--jobs", type=int, default=1, help="compile the configs in this many processes first")
    parser.add_argument("--json", help="write the rows here as well")
    args = parser.parse_args()
    flushes = list(dict.fromkeys(args.flush)) or list(FLUSHES)  # each asked once, in the order asked
    rows = measure(args.samples, args.config or ["{}"], args.shape, flushes, args.jobs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
