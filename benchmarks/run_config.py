"""Run one config of a template (or one of its comparators) on one shape a few times: a target for profilers
(Nsight Compute, nsys).

usage: python benchmarks/run_config.py TEMPLATE (--workload NAME | --shape B=2,S=32768,...)
       (--config JSON | --served DB_URL | --comparator NAME) [--iters 5] [--device cuda] [--nvtx-last RANGE]
       [--matmul-first]
``--config`` is a JSON object (missing parameters take the default), checked against the template's search
space. ``--served DB_URL`` takes the config the lookup serves for exactly that shape from that store (this
template version's best, else a carried version's; an error when there is none). ``--comparator NAME`` runs
that comparator line instead (e.g. ``mamba_ssm-wrapper``, ``ceiling-block1024``), on the shape its contract
sets (mamba_ssm's fp32 outputs). ``--nvtx-last RANGE`` wraps the last iteration in an NVTX range of that name
(CUDA), so that a profiler filtering on it (``ncu --nvtx --nvtx-include RANGE/``) sees the kernels of one warm
call only. Outputs are compared with the reference once (the relative L2 error of each output is printed), so
that a profile is never taken of a wrong kernel unknowingly.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _served_config(template: Any, shape: Any, url: str, device_kind: str) -> Any:
    """The config ``tuner best`` answers for exactly ``shape`` (the lookup's choice among the shape's entries)."""
    from tuner import db
    from tuner.store.entries import exact_answer

    space = template.space()
    answer = exact_answer(db.Store.open(url), template=template.name, version=template.version,
                          carries=template.spec.carries, space=space, shape=shape, device_kind=device_kind)
    if answer is None:
        raise SystemExit(f"error: {url} serves no config of {template.name} for {shape.key()} ({device_kind})")
    return space.validate_config(dict(answer.config))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--workload", help="a workload of the template")
    where.add_argument("--shape", help="an explicit shape, e.g. B=2,S=32768,H=80,has_bias=true,dtype=float32")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", help="JSON object; missing parameters take the default")
    what.add_argument("--served", metavar="DB_URL", help="the config the lookup serves for the shape from this store")
    what.add_argument("--comparator", help="a comparator line of the template instead of a config")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nvtx-last", default=None, help="NVTX range around the last iteration (CUDA)")
    ap.add_argument("--matmul-first", action="store_true",
                    help="one cuBLAS matmul on this thread before the first call (CUDA): the state of a measuring "
                         "process, in which some kernels run slower for the process's life "
                         "(benchmarks/h200/mimo_2026-12-05b/README.md)")
    args = ap.parse_args()
    if args.iters < 1:
        ap.error("--iters must be at least 1")

    import torch

    from tuner import registry
    from tuner.measure.verify import relative_l2
    from tuner.shapes import select_shapes

    template = registry.get(args.template)
    [(_, shape)] = select_shapes(template, workloads=[args.workload] if args.workload else [],
                                 shapes=[args.shape] if args.shape else [])
    if args.comparator:
        found = {c.name: c for c in template.comparators()}
        if args.comparator not in found:
            raise SystemExit(f"error: no comparator {args.comparator!r}; {template.name} has {sorted(found)}")
        comparator = found[args.comparator]
        shape = comparator.contract_shape(shape)
        reason = comparator.unavailable(shape)
        if reason is not None:
            raise SystemExit(f"error: {args.comparator} is unavailable here: {reason}")
        kernel = comparator.build(shape)
        note = " (a ceiling: it moves the bytes, not the math: large errors)" if comparator.ceiling else ""
        print(f"comparator {args.comparator} on {shape.key()}{note}")
    else:
        space = template.space()
        if args.served:
            config = _served_config(template, shape, args.served, args.device.split(":")[0])
        else:
            config = space.validate_config({**space.default.to_dict(), **json.loads(args.config)})
        if not space.is_valid(config, shape):
            raise SystemExit(f"error: {config.to_json()} is not valid for {shape.key()}")
        kernel = template.build(config, shape)
        print(f"config {config.to_json()} on {shape.key()}")
    inputs = template.make_inputs(shape, args.device, 0)
    outputs = template.allocate_outputs(shape, inputs)
    if args.matmul_first:
        a = torch.randn(1024, 1024, device=args.device, dtype=torch.bfloat16)
        (a @ a).sum().item()
        del a
    for i in range(args.iters):
        if args.nvtx_last and args.device == "cuda" and i == args.iters - 1:
            torch.cuda.synchronize()
            with torch.cuda.nvtx.range(args.nvtx_last):
                returned = kernel(inputs, outputs)
        else:
            returned = kernel(inputs, outputs)
    if args.device == "cuda":
        torch.cuda.synchronize()
    produced = returned if returned is not None else outputs  # a library wrapper returns its own outputs
    reference = template.reference(shape, inputs)
    for name, ref in reference.items():
        print(f"{name}: relative L2 error {relative_l2(produced[name], ref):.2e}")


if __name__ == "__main__":
    main()
