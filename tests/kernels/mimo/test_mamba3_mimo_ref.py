"""The PyTorch reference: chunked form against the step-by-step recurrence, autograd against finite
differences, and the float32 reference against float64."""

from __future__ import annotations

import math

import pytest
import torch

from tests.kernels.mimo.mimo_helpers import TEMPLATE, errors, tiny
from tuner.kernels.mamba3_mimo import reference as ref
from tuner.measure.verify import relative_l2


def _inputs64(shape, seed=0):
    t = TEMPLATE.make_inputs(shape, "cpu", seed)
    return {k: v.double() for k, v in t.items()}


@pytest.mark.parametrize(
    "dims",
    [
        {},
        {"R": 1},
        {"R": 4, "S": 24},
        {"H": 4, "G": 2},
        {"rotary_divisor": 2},
        {"N": 32, "P": 16, "R": 8, "S": 16},
    ],
    ids=["base", "r1", "r4", "groups", "div2", "r8"],
)
def test_chunked_matches_recurrent_output_and_gradients(dims):
    shape = tiny(**dims)
    t = _inputs64(shape)
    # Stronger dynamics than the default inputs, so that every term carries weight.
    t["DT"] = t["DT"] * 8
    t["ADT"] = t["ADT"] * 8
    t["Trap"] = t["Trap"] * 4 - 2
    step = ref.forward_recurrent(t)
    for chunk in (1, 4, 8):
        assert relative_l2(ref.forward_chunked(t, chunk), step) < 1e-12
    by_step = ref.gradients(t, chunk=4, dtype=torch.float64, recurrent=True)
    by_chunk = ref.gradients(t, chunk=8, dtype=torch.float64)
    errs = errors(by_chunk, by_step)
    assert max(errs.values()) < 1e-12, errs


def test_rotation_turns_pairs_j_and_half_plus_j():
    x = torch.zeros(8, dtype=torch.float64)
    x[1] = 1.0  # rotates with x[5]
    x[3] = 2.0  # j = 3 >= A = 2: passes through
    theta = torch.tensor([0.0, math.pi / 2], dtype=torch.float64)
    y = ref.rotate(x, theta)
    expected = torch.zeros(8, dtype=torch.float64)
    expected[5] = 1.0
    expected[3] = 2.0
    assert torch.allclose(y, expected, atol=1e-15)


def test_autograd_of_chunked_form_matches_finite_differences():
    shape = tiny(S=8, H=2, N=16, P=16, R=2)
    t = _inputs64(shape, seed=3)
    names = ref.INPUT_NAMES
    args = tuple(t[n].clone().requires_grad_(True) for n in names)

    def f(*xs):
        return (ref.forward_chunked(dict(zip(names, xs, strict=True)), 4) * t["dOut"]).sum()

    # fast_mode checks random directional derivatives of every input (the full Jacobian takes minutes).
    for seed in range(3):
        torch.manual_seed(seed)
        assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-6, fast_mode=True)


def test_float32_reference_is_accurate_against_float64():
    shape = TEMPLATE.reduced(TEMPLATE.workload("mimo-n128-p64-r4"))
    t = TEMPLATE.make_inputs(shape, "cpu", seed=1)
    g32 = TEMPLATE.reference(shape, t)
    g64 = ref.gradients(t, chunk=16, dtype=torch.float64)
    errs = errors(g32, g64)
    assert max(errs.values()) < 2e-5, errs
