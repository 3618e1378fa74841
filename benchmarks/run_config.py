"""Run one config of a template on one workload a few times: a target for profilers (Nsight Compute, nsys).

usage: python benchmarks/run_config.py TEMPLATE --workload NAME --config JSON [--iters 5] [--device cuda]
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
    for _ in range(args.iters):
        kernel(inputs, outputs)
    if args.device == "cuda":
        torch.cuda.synchronize()
    reference = template.reference(shape, inputs)
    for name, ref in reference.items():
        print(f"{name}: relative L2 error {relative_l2(outputs[name], ref):.2e}")


if __name__ == "__main__":
    main()
