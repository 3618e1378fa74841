"""Compile the MIMO backward's kernels for an NVIDIA target without a GPU, and report their resources.

The Triton interpreter accepts code that the GPU compiler rejects (and says nothing of registers), so this
runs the real compiler (Triton's bundled ptxas) ahead of time for sm_90 and reads each kernel's registers,
stack (spills) and shared memory back from the cubin. It must run in a process where TRITON_INTERPRET is
unset (``@triton.jit`` then yields compilable functions)::

    python benchmarks/mamba3_mimo_bwd_aot.py mimo-n128-p64-r4 '{"variant": "fused"}'

Raises whatever the Triton compiler raises for a kernel that does not compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tuner.frozen import Config, Shape
from tuner.kernels.mamba3_mimo import bwd_kernel as kern
from tuner.kernels.mamba3_mimo.bwd_launch import Dims, Plan, block_pairs, epilogue_steps, walk_columns
from tuner.kernels.mamba3_mimo.bwd_template import Mamba3MimoBwd

_LOWP_ARGS = frozenset({"Q", "K", "V", "Z", "DOUT", "TRAP", "DV", "DZ", "DTRAP"})


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses per thread (registers, stack bytes) and per program (shared bytes)."""

    kernel: str
    registers: int
    stack: int
    shared: int


def compile_kernel(fn: object, consts: dict, num_warps: int, num_stages: int, arch: int = 90) -> Resources:
    """Compile ``fn`` with the given constexprs (pointers: 16-bit for the low-precision tensors)."""
    names = fn.arg_names  # type: ignore[attr-defined]
    sig = {n: "constexpr" if n in consts else ("i32" if n == "n" else
                                               "*bf16" if n in _LOWP_ARGS else "*fp32") for n in names}
    compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    finally:
        os.unlink(f.name)
    fields = dict(tok.split(":", 1) for line in usage.splitlines() if "REG:" in line for tok in line.split())
    return Resources(fn.__name__, int(fields["REG"]), int(fields["STACK"]),  # type: ignore[attr-defined]
                     int(compiled.metadata.shared))


def compile_config(config: Config, shape: Shape, arch: int = 90) -> list[Resources]:
    """Every kernel the config launches for the shape (bf16 inputs)."""
    d = Dims.of(shape)
    plan = Plan.of(config, d)
    consts = dict(S=d.S, H=d.H, G=d.G, N=d.N, P=d.P, R=d.R, A=d.A, C=plan.chunk,
                  NB=block_pairs(plan, d), PREC=plan.prec, PREC_ROT=plan.prec_rot, LOWP=tl.bfloat16,
                  INTERP=False)

    def only(fn: object) -> dict:
        return {k: v for k, v in consts.items() if k in fn.arg_names}  # type: ignore[attr-defined]

    w, s = plan.num_warps, plan.num_stages
    gc = plan.group_chunks
    ng = d.S // plan.chunk // gc
    out = []
    if ng > 1 and plan.state_pass == "walk":
        out.append(compile_kernel(kern.state_walk_kernel, {**only(kern.state_walk_kernel),
                                                           "PB": walk_columns(plan, d)}, w, s, arch))
    elif ng > 1:
        out.append(compile_kernel(kern.group_local_kernel, {**only(kern.group_local_kernel), "GC": gc}, w, s,
                                  arch))
        out.append(compile_kernel(kern.state_scan_kernel, dict(
            NC=ng, NP=d.N * d.P, KC=min(plan.scan_chunks, triton.next_power_of_2(ng)),
            BLOCK=min(plan.scan_block, triton.next_power_of_2(d.N * d.P))), 4, 1, arch))
    out.append(compile_kernel(kern.group_bwd_kernel, {**consts, "GC": gc}, w, s, arch))
    out.append(compile_kernel(kern.rotary_table_kernel, dict(BLOCK=1024), 4, 1, arch))
    block, segment = epilogue_steps(d.S)
    out.append(compile_kernel(kern.epilogue_kernel, dict(S=d.S, H=d.H, A=d.A, BT=block, SEG=segment,
                                                         INTERP=False), 8, 1, arch))
    return out


def main(argv: list[str]) -> None:
    tpl = Mamba3MimoBwd()
    shape = tpl.workload(argv[0]) if argv[0] in {w.name for w in tpl.workloads} else tpl.make_shape(
        json.loads(argv[0]))
    space = tpl.space()
    overrides = json.loads(argv[1] if len(argv) > 1 else "{}")
    config = space.validate_config({**space.default.to_dict(), **overrides})
    for r in compile_config(config, shape):
        print(f"{r.kernel}: registers={r.registers} stack={r.stack} shared={r.shared}")


if __name__ == "__main__":
    main(sys.argv[1:])
