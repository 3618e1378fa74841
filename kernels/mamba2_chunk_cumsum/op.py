"""Mamba2 chunk cumulative sum, forward (the TileOPs contract): the operator, independent of any backend.

Inputs: ``dt`` fp32 (B, S, H); ``A`` fp32 (H); ``dt_bias`` fp32 (H) when ``has_bias``; ``dt_limit`` fp32 (2,)
holding [dt_min, dt_max] on the device (run-time scalars: they never change the kernel). Per element
x = dt + dt_bias; x = softplus(x) = log1p(exp(x)) where x <= 20, else x (when ``softplus``); x = clamp(x,
dt_min, dt_max). Outputs, both (B, H, S/Q, Q): ``dt_out`` = x in the shape's ``dtype``; ``dA_cumsum`` fp32,
the inclusive cumsum within each chunk of x·A, from the fp32 x (not the rounded dt_out).

:class:`Mamba2ChunkCumsumOp` is the operator half of a template (inputs, reference, outputs
and their bounds, roofline bytes, comparators); the Triton (kernels/mamba2_chunk_cumsum/triton_template.py) and TileLang
(kernels/mamba2_chunk_cumsum/tilelang_template.py) templates add name, version, backend and ``build``, so that
both are checked and compared against exactly the same contract. Stateless and thread-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from tuner.frozen import Shape
from tuner.kernels.mamba2_chunk_cumsum import ceiling as ceiling_lines
from tuner.kernels.mamba2_chunk_cumsum import comparator_mamba_ssm as mamba_ssm_lines
from tuner.template import Comparator, OutputSpec, Tensors

if TYPE_CHECKING:
    import torch


# Inputs drawn by make_inputs: dt ~ N(0, 3²) with 1% of entries in [30, 60] (the x > 20 bypass), biases and
# A as Mamba2 initialises them. With dt_limit = (1e-3, 4), 1% (no bias) to 28% (bias) of the values hit the
# lower bound and 1–10% the upper one (the tests check both are hit).
DT_SCALE = 3.0
DT_MIN = 1e-3
DT_MAX = 4.0
BYPASS_FRACTION = 0.01

# Error bounds (relative L2 over the tensor, ‖out − ref‖ / ‖ref‖, against float64 references):
# - dt_out is compared with the unrounded float64 value, so its error is the rounding to the output dtype
#   (at most u = 2^-11 ≈ 4.9e-4 relatively for float16, 2^-8 ≈ 3.9e-3 for bfloat16 — 8 significant bits —
#   and 2^-24 for float32) plus the fp32 arithmetic (~1e-6: exp and log to a few ulp). The bounds are
#   about 2u (float16: 1e-3; bfloat16: 5e-3, above the worst case 3.9e-3; float32: 1e-5): a correct kernel
#   always passes; a missing bias, clamp or softplus, or a wrong head or chunk, is off by far more.
# - dA_cumsum: fp32 prefix sums of at most Q same-sign terms. Triton's scans are blocked (at most 32
#   elements in a thread — a search-space constraint — then log-depth shuffles, a cross-warp pass and the
#   SPLIT carry), so the error is below (32 + 2·log2 Q)·2^-24 ≈ 3e-6 even for adversarial data, and ~1e-7
#   on random data (measured 5e-8 … 1.4e-7, mamba_ssm's kernel alike); dt adds ≲ 3e-7. The bound 1e-5
#   passes every correct fp32 kernel and fails one that takes dA from the rounded dt_out (≥ 1.6e-5 for
#   float16, ≥ 1.2e-4 for bfloat16 on these inputs: see the tests).
DT_OUT_RTOL = {"float16": 1e-3, "bfloat16": 5e-3, "float32": 1e-5}
DA_CUMSUM_RTOL = 1e-5


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def itemsize(name: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4}[name]


class Mamba2ChunkCumsumOp:
    """Operator half of the Mamba2 chunk-cumsum templates: a mixin, ``class T(Mamba2ChunkCumsumOp, KernelTemplate)``."""

    # Class-level bounds are the loosest over dtypes; output_specs(shape) gives the per-dtype ones.
    outputs: ClassVar[tuple[OutputSpec, ...]] = (
        OutputSpec("dt_out", rtol=max(DT_OUT_RTOL.values())),
        OutputSpec("dA_cumsum", rtol=DA_CUMSUM_RTOL),
    )
    # -- shapes (dims, workloads and their rules: tuner.kernels.mamba2_chunk_cumsum.spec) ------------------
    def reduced(self, shape: Shape) -> Shape:
        """Q=64, S=4 chunks, B ≤ 2, H/4 heads (48→12, 64→16, 80→20: masking stays exercised)."""
        q = min(int(shape["Q"]), 64)
        return shape.replace(B=min(int(shape["B"]), 2), S=4 * q, Q=q, H=max(1, int(shape["H"]) // 4))

    def output_specs(self, shape: Shape) -> tuple[OutputSpec, ...]:
        """The outputs with the error bounds of this shape's dtype (see DT_OUT_RTOL)."""
        return (
            OutputSpec("dt_out", rtol=DT_OUT_RTOL[str(shape["dtype"])]),
            OutputSpec("dA_cumsum", rtol=DA_CUMSUM_RTOL),
        )

    # -- math --------------------------------------------------------------------------------------
    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, torch.Tensor]:
        """dt, A, (dt_bias), dt_limit; reproducible from ``seed`` (drawn on the CPU, then moved)."""
        import torch

        g = torch.Generator().manual_seed(seed)
        b, s, h = int(shape["B"]), int(shape["S"]), int(shape["H"])
        dt = torch.randn(b, s, h, generator=g) * DT_SCALE
        bypass = torch.rand(b, s, h, generator=g) < BYPASS_FRACTION
        dt = torch.where(bypass, 30.0 + 30.0 * torch.rand(b, s, h, generator=g), dt)
        inputs = {
            "dt": dt,
            "A": -torch.empty(h).uniform_(1.0, 16.0, generator=g),
            "dt_limit": torch.tensor([DT_MIN, DT_MAX], dtype=torch.float32),
        }
        if shape["has_bias"]:
            # inverse softplus of log-uniform values in [1e-3, 1e-1], as Mamba2 initialises dt_bias
            target = torch.exp(torch.empty(h).uniform_(-6.9078, -2.3026, generator=g))
            inputs["dt_bias"] = target + torch.log(-torch.expm1(-target))
        return {k: v.to(device) for k, v in inputs.items()}

    def reference(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        """Plain float64 PyTorch: the unrounded dt_out and dA_cumsum, as (B, H, S/Q, Q) tensors."""
        import torch

        b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
        x = inputs["dt"].double()
        if shape["has_bias"]:
            x = x + inputs["dt_bias"].double()
        if shape["softplus"]:
            x = torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
        dt_min, dt_max = inputs["dt_limit"].double().tolist()
        x = x.clamp(dt_min, dt_max)
        dt_out = x.reshape(b, s // q, q, h).permute(0, 3, 1, 2).contiguous()
        da = torch.cumsum(dt_out * inputs["A"].double()[None, :, None, None], dim=-1)
        return {"dt_out": dt_out, "dA_cumsum": da}

    def allocate_outputs(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        import torch

        b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
        device = inputs["dt"].device
        out_shape = (b, h, s // q, q)
        return {
            "dt_out": torch.empty(out_shape, dtype=torch_dtype(str(shape["dtype"])), device=device),
            "dA_cumsum": torch.empty(out_shape, dtype=torch.float32, device=device),
        }

    def comparators(self) -> tuple[Comparator, ...]:
        """mamba_ssm as users call it and its contract variants, then the elementwise memory ceiling."""
        return mamba_ssm_lines.comparators() + ceiling_lines.comparators()

    # -- roofline ----------------------------------------------------------------------------------
    def bytes_moved(self, shape: Shape) -> int:
        """dt read, dA_cumsum and dt_out written, A (and dt_bias) read once."""
        n = int(shape["B"]) * int(shape["S"]) * int(shape["H"])
        per_head = 2 if shape["has_bias"] else 1
        return n * (4 + 4 + itemsize(str(shape["dtype"]))) + int(shape["H"]) * 4 * per_head

    def flops(self, shape: Shape) -> int:
        """Per element: the dA product and the scan addition (+ the bias add); exp/log/clamp not counted."""
        n = int(shape["B"]) * int(shape["S"]) * int(shape["H"])
        return n * (3 if shape["has_bias"] else 2)

