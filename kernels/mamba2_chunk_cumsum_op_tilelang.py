"""Mamba2 chunk cumulative sum, forward: the operator, independent of any backend.

This is the operator-level half of a template (dims, workloads, inputs, reference, outputs and their error
bounds, roofline bytes). It is a mixin: ``class T(Mamba2ChunkCumsumOp, KernelTemplate)`` adds name, version,
backend and ``build``. The Triton template (kernels/mamba2_chunk_cumsum.py, class Mamba2ChunkCumsum) defines
the same contract; every definition here matches it (names, defaults, input distributions for a seed, error
bounds, reduced shapes), so that the two can be merged into one operator definition without changing results.

Contract. Inputs: ``dt`` fp32 (B, S, H); ``A`` fp32 (H); ``dt_bias`` fp32 (H) when ``has_bias``;
``dt_limit`` fp32 (2,) = [dt_min, dt_max] on the device (run-time scalars: they never change the kernel).
Per element: x = dt (+ dt_bias); when ``softplus``, x = log1p(exp(x)) where x <= 20, else x; x = clamp(x,
dt_min, dt_max). Outputs, both (B, H, S/Q, Q): ``dt_out`` = x in the shape's ``dtype``, and ``dA_cumsum``
fp32 = the inclusive cumsum within each chunk of x·A computed from the fp32 x (before rounding to dtype).
S must be a multiple of Q (ShapeError otherwise). Instances are stateless and thread-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from tuner.errors import ShapeError
from tuner.frozen import Shape
from tuner.template import Dim, OutputSpec, Tensors, Workload

if TYPE_CHECKING:
    import torch

DTYPES = ("float16", "bfloat16", "float32")
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}

# Input distribution (kept identical to the Triton template's, so a seed gives the same tensors):
# dt ~ N(0, 3²) with 1% of the entries in [30, 60] (they take the x > 20 bypass), A uniform in [-16, -1]
# and dt_bias the inverse softplus of log-uniform values in [1e-3, 1e-1], as Mamba2 initialises them.
# dt_limit = (1e-3, 4): both bounds clip part of the values, so a missing clamp is caught.
DT_SCALE = 3.0
BYPASS_FRACTION = 0.01
DT_LIMIT = (1e-3, 4.0)
SOFTPLUS_THRESHOLD = 20.0

# Relative L2 bounds ‖out − ref‖/‖ref‖ against float64 references. dt_out errs by its rounding to dtype (unit
# roundoff 2^-11 for float16, 2^-8 for bfloat16, 2^-24 for float32) plus ~1e-6 from fp32 exp/log; the bounds
# are about twice that. dA_cumsum is an fp32 scan of at most Q same-sign terms (≤ 1.5e-5 even sequentially).
DT_OUT_RTOL = {"float16": 1e-3, "bfloat16": 5e-3, "float32": 1e-5}
DA_CUMSUM_RTOL = 2e-5


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype dim value (``float16`` → torch.float16)."""
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


class Mamba2ChunkCumsumOp:
    """Operator-level half of the Mamba2 chunk-cumsum templates (a mixin for :class:`KernelTemplate`)."""

    dims: ClassVar[tuple[Dim, ...]] = (
        Dim("B", doc="batch"),
        Dim("S", doc="sequence length, a multiple of Q"),
        Dim("H", doc="heads"),
        Dim("Q", default=256, minimum=16, doc="chunk size, a power of two"),
        Dim("has_bias", "bool", default=False, doc="dt_bias is added before the softplus"),
        Dim("dtype", "str", default="float16", choices=DTYPES, doc="dtype of dt_out"),
        Dim("softplus", "bool", default=True, doc="apply softplus (with the x > 20 bypass)"),
    )
    # The class-level bound of dt_out is the loosest over dtypes; output_specs(shape) gives the dtype's own.
    outputs: ClassVar[tuple[OutputSpec, ...]] = (
        OutputSpec("dt_out", rtol=max(DT_OUT_RTOL.values())),
        OutputSpec("dA_cumsum", rtol=DA_CUMSUM_RTOL),
    )
    workloads: ClassVar[tuple[Workload, ...]] = (
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

    # -- shapes ------------------------------------------------------------------------------------
    def check_shape(self, shape: Shape) -> None:
        """ShapeError unless Q is a power of two and S a multiple of Q."""
        q, s = int(shape["Q"]), int(shape["S"])
        if q & (q - 1):
            raise ShapeError(f"chunk size Q must be a power of two, got {q}")
        if s % q:
            raise ShapeError(f"sequence length S={s} is not a multiple of the chunk size Q={q}")

    def reduced(self, shape: Shape) -> Shape:
        """Q=64, 4 chunks, B ≤ 2, H/4 heads (48→12, 64→16, 80→20): small enough for CPU tests."""
        q = min(int(shape["Q"]), 64)
        return shape.replace(B=min(int(shape["B"]), 2), S=4 * q, Q=q, H=max(1, int(shape["H"]) // 4))

    def output_specs(self, shape: Shape) -> tuple[OutputSpec, ...]:
        """The outputs with the error bounds of this shape's dtype."""
        return (
            OutputSpec("dt_out", rtol=DT_OUT_RTOL[str(shape["dtype"])]),
            OutputSpec("dA_cumsum", rtol=DA_CUMSUM_RTOL),
        )

    # -- math --------------------------------------------------------------------------------------
    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, torch.Tensor]:
        """dt, A, dt_limit and (with has_bias) dt_bias; drawn on the CPU from ``seed``, then moved."""
        import torch

        g = torch.Generator().manual_seed(seed)
        b, s, h = int(shape["B"]), int(shape["S"]), int(shape["H"])
        dt = torch.randn(b, s, h, generator=g) * DT_SCALE
        bypass = torch.rand(b, s, h, generator=g) < BYPASS_FRACTION
        dt = torch.where(bypass, 30.0 + 30.0 * torch.rand(b, s, h, generator=g), dt)
        inputs = {
            "dt": dt,
            "A": -torch.empty(h).uniform_(1.0, 16.0, generator=g),
            "dt_limit": torch.tensor(DT_LIMIT, dtype=torch.float32),
        }
        if shape["has_bias"]:
            target = torch.exp(torch.empty(h).uniform_(-6.9078, -2.3026, generator=g))  # ln 1e-3 .. ln 1e-1
            inputs["dt_bias"] = target + torch.log(-torch.expm1(-target))  # softplus⁻¹(target)
        return {k: v.to(device) for k, v in inputs.items()}

    def reference(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        """float64 PyTorch: the unrounded dt_out and dA_cumsum, (B, H, S/Q, Q) each."""
        import torch

        b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
        x = inputs["dt"].double()
        if shape["has_bias"]:
            x = x + inputs["dt_bias"].double()
        if shape["softplus"]:
            x = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
        dt_min, dt_max = inputs["dt_limit"].double().tolist()
        x = x.clamp(dt_min, dt_max)
        dt_out = x.reshape(b, s // q, q, h).permute(0, 3, 1, 2).contiguous()
        da = torch.cumsum(dt_out * inputs["A"].double()[None, :, None, None], dim=-1)
        return {"dt_out": dt_out, "dA_cumsum": da}

    def allocate_outputs(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        """Uninitialised dt_out (dtype) and dA_cumsum (fp32), (B, H, S/Q, Q), on dt's device."""
        import torch

        b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
        device = inputs["dt"].device
        out_shape = (b, h, s // q, q)
        return {
            "dt_out": torch.empty(out_shape, dtype=torch_dtype(str(shape["dtype"])), device=device),
            "dA_cumsum": torch.empty(out_shape, dtype=torch.float32, device=device),
        }

    # -- roofline ----------------------------------------------------------------------------------
    def bytes_moved(self, shape: Shape) -> int:
        """dt read, dA_cumsum and dt_out written once; A (and dt_bias) read once."""
        n = int(shape["B"]) * int(shape["S"]) * int(shape["H"])
        per_head = 2 if shape["has_bias"] else 1
        return n * (4 + 4 + ITEMSIZE[str(shape["dtype"])]) + int(shape["H"]) * 4 * per_head

    def flops(self, shape: Shape) -> int:
        """Per element the dA product and the scan addition (and the bias add); exp/log/clamp not counted."""
        n = int(shape["B"]) * int(shape["S"]) * int(shape["H"])
        return n * (3 if shape["has_bias"] else 2)
