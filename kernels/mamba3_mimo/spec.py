"""Template: the backward of Mamba3's MIMO layer (Triton), fused or split into chunk-parallel passes.

The kernel under test is the backward: given the forward inputs, the saved rotary angle cumsum
``AnglesCS`` (mamba_ssm's forward saves it for its backward) and the upstream gradient ``dOut``, it writes
the gradient of every input. It recomputes what it needs of the forward; that recompute is timed with it.
The reference is autograd of the float32 chunked form in :mod:`tuner.kernels.mamba3_mimo.reference`; the comparator
is mamba_ssm's TileLang backward (:mod:`tuner.kernels.mamba3_mimo.comparator_mamba_ssm`).

Config parameters (``search_spaces/mamba3_mimo_bwd.yaml``): ``variant`` (split: chunk-parallel passes
around a scan; fused: one program per (batch, head) walking the chunks like the TileLang kernels; grouped:
one program per ``group_chunks`` consecutive chunks, the scan over groups),
``chunk_rows`` (C·R rows per MIMO chunk, so C = chunk_rows / R), ``prec`` and ``prec_rot`` (matmul operand
precision), ``block_n`` (rotary pairs per block of N), ``num_warps``, ``num_stages``, ``scan_block``,
``scan_chunks``, ``group_chunks``, ``state_pass`` (split/split2: the chunk states by pass A and a scan, or
walked through the chunks by one program per state tile), ``qk_warps`` (split2: the q/k kernel's warps as half,
the same as or double ``num_warps``, the value kernel's).
"""

# This module is the template's spec (torch-free, see tuner.spec): dims, workloads, shape rules; its docstring
# is the template's doc. The implementation is tuner.kernels.mamba3_mimo.bwd_template.

from __future__ import annotations

from tuner.dims import Dim, ShapeRule
from tuner.spec import CarriedVersion, TemplateSpec, Workload

# mamba_ssm's own settings per official (N, P, R): (chunk size, bb_threads) of its TileLang backward.
OFFICIAL_SETTINGS: dict[tuple[int, int, int], tuple[int, int]] = {
    (16, 64, 4): (8, 128),
    (32, 64, 4): (16, 256),
    (64, 64, 4): (16, 256),
    (128, 64, 4): (16, 256),
    (256, 64, 4): (8, 256),
    (64, 128, 4): (16, 256),
    (128, 32, 4): (16, 256),
    (128, 128, 4): (8, 256),
    (128, 64, 8): (8, 256),
    (128, 64, 2): (32, 256),
    (128, 64, 1): (64, 256),
}

# (N, P, R) of the 11 official shapes; B=4, S=2048, H=16, G=1, rotary divisor 4, bf16.
OFFICIAL = tuple(OFFICIAL_SETTINGS)

DIMS: tuple[Dim, ...] = (
    Dim("B", doc="batch"),
    Dim("S", minimum=8, doc="sequence length"),
    Dim("H", doc="heads"),
    Dim("G", default=1, doc="q/k head groups (H % G == 0)"),
    Dim("N", minimum=16, doc="q/k head dim (state size), a power of two"),
    Dim("P", minimum=16, doc="v head dim, a power of two"),
    Dim("R", doc="MIMO rank, a power of two"),
    Dim("rotary_divisor", default=4, minimum=2, doc="N / rotary_divisor rotary angles per head (2 or 4)"),
    Dim("dtype", kind="str", default="bfloat16", choices=("bfloat16", "float16"),
        doc="dtype of Q, K, V, Z, Trap, dOut"),
)


def _workload(n: int, p: int, r: int) -> Workload:
    chunk, threads = OFFICIAL_SETTINGS[(n, p, r)]
    return Workload(
        name=f"mimo-n{n}-p{p}-r{r}",
        shape={"B": 4, "S": 2048, "H": 16, "G": 1, "N": n, "P": p, "R": r},
        doc=f"mamba_ssm test grid; TileLang baseline runs chunk {chunk}, bb_threads {threads}",
    )


SHAPE_RULES: tuple[ShapeRule, ...] = (
    *(ShapeRule(f"is_pow2({d})", f"{d}={{{d}}} must be a power of two") for d in ("N", "P", "R")),
    ShapeRule("H % G == 0", "H={H} must be a multiple of G={G}"),
    ShapeRule("rotary_divisor in (2, 4)", "rotary_divisor must be 2 or 4, got {rotary_divisor}"),
    ShapeRule("S % 8 == 0", "S={S} must be a multiple of 8 (the smallest chunk)"),
)


BWD = TemplateSpec(
    name="mamba3_mimo_bwd",
    # 2: chunk kernels compiled with a register cap (maxnreg); split2 variant. 3: the state walk
    # (state_pass), the epilogue in segments run in parallel. 4: split2's q/k kernel with warps of its own
    # (qk_warps)
    version="4",
    # earlier versions' bests are served until version 4 has its own, the first carried version that has one:
    # version 3's configs run the same kernels under version 4 with qk_warps=same; version 2's with the scan
    # run the same chunk kernels (the epilogue is faster since version 3), so their stored times are upper bounds
    carries=(CarriedVersion("3", (("qk_warps", "same"),)),
             CarriedVersion("2", (("state_pass", "scan"), ("qk_warps", "same")))),
    backend="triton",
    dims=DIMS,
    workloads=tuple(_workload(*npr) for npr in OFFICIAL),
    shape_rules=SHAPE_RULES,
    implementation="tuner.kernels.mamba3_mimo.bwd_template:Mamba3MimoBwd",
    doc=__doc__ or "",
)
