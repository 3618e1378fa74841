"""Run one config of a template on one workload a few times: a target for profilers (Nsight Compute, nsys).

usage: python benchmarks/run_config.py TEMPLATE --workload NAME --config JSON [--iters 5] [--device cuda]
       [--nvtx-last RANGE]
``--nvtx-last RANGE`` wraps the last iteration in an NVTX range of that name (CUDA), so that a profiler
filtering on it (``ncu --nvtx --nvtx-include RANGE/``) sees the kernels of one warm call only.
The config is checked against the template's search space; outputs are compared with the reference once
(the relative L2 error of each output is printed) so that a profile is never taken of a wrong kernel.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--config", required=True, help="JSON object; missing parameters take the default")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nvtx-last", default=None, help="NVTX range around the last iteration (CUDA)")
    args = ap.parse_args()

    import torch

    from tuner import registry
    from tuner.measure.verify import relative_l2

    template = registry.get(args.template)
    shape = template.workload(args.workload)
    space = template.space()
    config = space.validate_config({**space.default.to_dict(), **json.loads(args.config)})
    if not space.is_valid(config, shape):
        raise SystemExit(f"error: {config.to_json()} is not valid for {args.workload}")
    kernel = template.build(config, shape)
    inputs = template.make_inputs(shape, args.device, 0)
    outputs = template.allocate_outputs(shape, inputs)
    for i in range(args.iters):
        if args.nvtx_last and args.device == "cuda" and i == args.iters - 1:
            torch.cuda.synchronize()
            with torch.cuda.nvtx.range(args.nvtx_last):
                kernel(inputs, outputs)
        else:
            kernel(inputs, outputs)
    if args.device == "cuda":
        torch.cuda.synchronize()
    reference = template.reference(shape, inputs)
    for name, ref in reference.items():
        print(f"{name}: relative L2 error {relative_l2(outputs[name], ref):.2e}")


if __name__ == "__main__":
    main()
