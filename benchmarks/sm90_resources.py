"""Registers, spills and shared memory of a Triton template's kernels on sm_90, compiled without a GPU.

Kernel engineers chasing register pressure need ptxas's verdict, not a device: this compiles every Triton
kernel a config launches for an H100/H200 (sm_90a) on a CPU-only host and prints, per kernel, what
``cuobjdump --dump-resource-usage`` reports (REG registers per thread, STACK bytes of stack frame — spilled
registers live there —, SHARED bytes). Nothing runs: Triton's driver is replaced by a stand-in that reports
an sm_90 target, and every launch ``kernel[grid](...)`` becomes ``kernel.warmup(...)`` (compile only).
It leans on Triton internals (``triton.runtime.driver.set_active``, ``JITFunction.warmup``), checked with
triton 3.9; the ptxas bundled with that Triton may differ from the one on the GPU host.

usage: python benchmarks/sm90_resources.py TEMPLATE --workload NAME --config JSON [--config JSON ...]
       (a config is a JSON object of overrides of the default; the shape is taken at batch 1)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"


class _Sm90Driver:
    """The parts of Triton's active driver that compiling needs, answering for one sm_90 device."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")


def _compile_only() -> dict[str, Any]:
    """Route launches to compilation; returns the dict that collects compiled kernels by name."""
    import triton.runtime.jit as jit
    from triton.runtime import driver

    driver.set_active(_Sm90Driver())
    compiled: dict[str, Any] = {}

    def getitem(self: Any, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            compiled[self.fn.__name__] = self.warmup(*args, grid=grid, **kwargs)

        return launch

    jit.JITFunction.__getitem__ = getitem  # type: ignore[method-assign]
    return compiled


def _usage(cubin: bytes) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    line = next((ln.strip() for ln in out.splitlines() if "REG:" in ln), "")
    fields = dict(part.split(":", 1) for part in line.split() if ":" in part)
    reg, stack, shared = (fields.get(k, "?") for k in ("REG", "STACK", "SHARED"))
    return f"REG {reg:>3}  STACK {stack:>5}  SHARED {shared:>6}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--config", action="append", default=None, help="JSON overrides of the default")
    ap.add_argument("--ignore-constraints", action="store_true",
                    help="compile configs the search space rules out (to see what a constraint costs)")
    args = ap.parse_args()
    compiled = _compile_only()

    from tuner import registry

    template = registry.get(args.template)
    shape = template.workload(args.workload).replace(B=1)
    space = template.space()
    for overrides in args.config or ["{}"]:
        config = space.validate_config({**space.default.to_dict(), **json.loads(overrides)})
        print(f"{args.workload} {overrides}")
        if not args.ignore_constraints and not space.is_valid(config, shape):
            print("  invalid for this shape (the search space's constraints)")
            continue
        compiled.clear()
        inputs = template.make_inputs(shape, "cpu", 0)
        template.build(config, shape)(inputs, template.allocate_outputs(shape, inputs))
        for name, kernel in compiled.items():
            print(f"  {name:24s} {_usage(kernel.asm['cubin'])}")


if __name__ == "__main__":
    main()
