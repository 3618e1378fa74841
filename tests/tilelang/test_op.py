"""The operator contract: reference against an element-by-element computation, inputs, shapes, bytes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tuner.errors import ShapeError
from tuner.kernels.mamba2_chunk_cumsum import spec
from tuner.kernels.mamba2_chunk_cumsum.op import DA_CUMSUM_RTOL, DT_MAX, DT_MIN, Mamba2ChunkCumsumOp
from tuner.template import KernelTemplate


class _Op(Mamba2ChunkCumsumOp, KernelTemplate):
    """The operator alone (build is not needed here), with the templates' dims, workloads and shape rules."""

    SPEC = dataclasses.replace(spec.TRITON, name="op_only", version="0", backend="tilelang",
                               implementation=f"{__name__}:_Op")

    def build(self, config, shape):  # type: ignore[no-untyped-def]
        raise NotImplementedError


OP = _Op()


def _scalar_reference(shape, inputs):  # type: ignore[no-untyped-def]
    """Plain Python floats, one element at a time: independent of the vectorised torch reference."""
    b_, s_, h_, q_ = (int(shape[d]) for d in ("B", "S", "H", "Q"))
    dt = inputs["dt"].tolist()
    a = inputs["A"].tolist()
    bias = inputs["dt_bias"].tolist() if shape["has_bias"] else [0.0] * h_
    lo, hi = inputs["dt_limit"].tolist()
    dt_out = [[[[0.0] * q_ for _ in range(s_ // q_)] for _ in range(h_)] for _ in range(b_)]
    da = [[[[0.0] * q_ for _ in range(s_ // q_)] for _ in range(h_)] for _ in range(b_)]
    for b in range(b_):
        for h in range(h_):
            for c in range(s_ // q_):
                running = 0.0
                for i in range(q_):
                    x = dt[b][c * q_ + i][h] + bias[h]
                    if shape["softplus"] and x <= 20.0:
                        x = math.log1p(math.exp(x))
                    x = min(max(x, lo), hi)
                    running += x * a[h]
                    dt_out[b][h][c][i] = x
                    da[b][h][c][i] = running
    return torch.tensor(dt_out, dtype=torch.float64), torch.tensor(da, dtype=torch.float64)


@pytest.mark.parametrize(
    "raw",
    [
        {"B": 2, "S": 64, "H": 3, "Q": 16, "has_bias": True},
        {"B": 1, "S": 96, "H": 5, "Q": 32, "has_bias": False},
        {"B": 1, "S": 32, "H": 2, "Q": 16, "has_bias": True, "softplus": False},
    ],
)
def test_reference_matches_scalar_computation(raw: dict) -> None:
    shape = OP.make_shape(raw)
    inputs = OP.make_inputs(shape, "cpu", seed=3)
    ref = OP.reference(shape, inputs)
    dt_out, da = _scalar_reference(shape, inputs)
    torch.testing.assert_close(ref["dt_out"], dt_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref["dA_cumsum"], da, rtol=1e-10, atol=1e-10)


def test_inputs_exercise_clamp_bypass_and_are_reproducible() -> None:
    shape = OP.make_shape({"B": 2, "S": 1024, "H": 16, "has_bias": True})
    a, b = OP.make_inputs(shape, "cpu", seed=7), OP.make_inputs(shape, "cpu", seed=7)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["dt"], OP.make_inputs(shape, "cpu", seed=8)["dt"])
    assert set(a) == {"dt", "A", "dt_bias", "dt_limit"}
    assert a["dt_limit"].tolist() == pytest.approx([DT_MIN, DT_MAX])
    x = a["dt"] + a["dt_bias"]
    activated = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    lo, hi = DT_MIN, DT_MAX
    below, above = (activated < lo).float().mean().item(), (activated > hi).float().mean().item()
    assert 0.01 < below < 0.9 and 0.01 < above < 0.9, (below, above)  # both bounds clip part of the data
    assert (x > 20).any()  # the softplus bypass is taken
    assert (a["A"] < 0).all()
    assert "dt_bias" not in OP.make_inputs(shape.replace(has_bias=False), "cpu", seed=7)


def test_shapes_outputs_and_bytes() -> None:
    with pytest.raises(ShapeError):
        OP.make_shape({"B": 1, "S": 300, "H": 4})
    with pytest.raises(ShapeError):
        OP.make_shape({"B": 1, "S": 384, "H": 4, "Q": 96})
    shape = OP.workload("mamba2-2p7b-b2-s32k-dt-bias")
    assert (shape["B"], shape["S"], shape["H"], shape["Q"], shape["dtype"]) == (2, 32768, 80, 256, "float16")
    n = 2 * 32768 * 80
    assert OP.bytes_moved(shape) == 10 * n + 2 * 4 * 80  # measuring.md: 10·B·S·H (+ A and dt_bias)
    small = OP.make_shape({"B": 1, "S": 64, "H": 3, "Q": 16, "dtype": "bfloat16"})
    outs = OP.allocate_outputs(small, OP.make_inputs(small, "cpu", 0))
    assert outs["dt_out"].shape == outs["dA_cumsum"].shape == (1, 3, 4, 16)
    assert (outs["dt_out"].dtype, outs["dA_cumsum"].dtype) == (torch.bfloat16, torch.float32)
    assert [s.rtol for s in OP.output_specs(small)] == [5e-3, DA_CUMSUM_RTOL]
    reduced = OP.reduced(OP.workload("mamba2-1p3b-b8-s2k"))
    assert (reduced["B"], reduced["S"], reduced["H"], reduced["Q"]) == (2, 256, 16, 64)
    assert [w.name for w in OP.workloads] == [
        "mamba2-780m-b1-s4k",
        "mamba2-1p3b-b8-s2k",
        "mamba2-780m-b1-s4k-dt-bias",
        "mamba2-1p3b-b8-s2k-dt-bias",
        "mamba2-2p7b-b2-s32k-dt-bias",
    ]
