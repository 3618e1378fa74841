"""Specs of the Mamba2 chunk-cumsum templates (Triton and TileLang): dims, workloads and shape rules.

Torch-free (see :mod:`tuner.spec`): the API and the registry read these without importing the kernels.
"""

from __future__ import annotations

from tuner.dims import Dim, ShapeRule
from tuner.spec import CarriedVersion, TemplateSpec, Workload

DTYPES = ("float16", "bfloat16", "float32")

DIMS: tuple[Dim, ...] = (
    Dim("B", doc="batch"),
    Dim("S", doc="sequence length, a multiple of Q"),
    Dim("H", doc="heads (any count: blocks of heads are masked)"),
    Dim("Q", default=256, minimum=16, doc="chunk size, a power of two"),
    Dim("has_bias", "bool", default=False, doc="dt_bias is added before the softplus"),
    Dim("dtype", "str", default="float16", choices=DTYPES, doc="dtype of dt_out"),
    Dim("softplus", "bool", default=True, doc="apply softplus (with the x > 20 bypass)"),
)

WORKLOADS: tuple[Workload, ...] = (
    Workload("mamba2-780m-b1-s4k", {"B": 1, "S": 4096, "H": 48, "has_bias": False, "dtype": "float16"}),
    Workload("mamba2-1p3b-b8-s2k", {"B": 8, "S": 2048, "H": 64, "has_bias": False, "dtype": "bfloat16"}),
    Workload(
        "mamba2-780m-b1-s4k-dt-bias", {"B": 1, "S": 4096, "H": 48, "has_bias": True, "dtype": "float16"}
    ),
    Workload(
        "mamba2-1p3b-b8-s2k-dt-bias", {"B": 8, "S": 2048, "H": 64, "has_bias": True, "dtype": "bfloat16"}
    ),
    Workload(
        "mamba2-2p7b-b2-s32k-dt-bias", {"B": 2, "S": 32768, "H": 80, "has_bias": True, "dtype": "float16"}
    ),
)


# Q a power of two, S a multiple of Q, S·H within the kernel's 32-bit offsets.
SHAPE_RULES: tuple[ShapeRule, ...] = (
    ShapeRule("is_pow2(Q)", "chunk size Q must be a power of two, got {Q}"),
    ShapeRule("S * H < 2**31", "S*H = {S}*{H} elements per batch: beyond the kernel's 32-bit offsets"),
    ShapeRule("S % Q == 0", "sequence length S={S} is not a multiple of the chunk size Q={Q} "
                            "(pad S to a multiple of Q, or choose another Q)"),
)


TRITON = TemplateSpec(
    name="mamba2_chunk_cumsum",
    version="1",
    backend="triton",
    dims=DIMS,
    workloads=WORKLOADS,
    shape_rules=SHAPE_RULES,
    implementation="tuner.kernels.mamba2_chunk_cumsum.triton_template:Mamba2ChunkCumsum",
    doc="Mamba2 ``_chunk_cumsum_fwd`` with fp32 dA_cumsum and dt_out in the workload's dtype, in Triton.",
)

TILELANG = TemplateSpec(
    name="mamba2_chunk_cumsum_tilelang",
    version="6",  # 2: persist; 3: persist need not divide the tiles; 4: min_blocks; 5: load_cache; 6: scan warp
    backend="tilelang",
    dims=DIMS,
    workloads=WORKLOADS,
    shape_rules=SHAPE_RULES,
    implementation="tuner.kernels.mamba2_chunk_cumsum.tilelang_template:Mamba2ChunkCumsumTileLang",
    doc="TileLang kernels for the Mamba2 chunk cumsum: one CTA per (batch, chunk group, head block).",
    # version 6 added a choice (scan warp) and changed no kernel of version 5: its bests are served, as they
    # were measured, for the shapes version 6 has not tuned yet
    carries=(CarriedVersion("5"),),
)
