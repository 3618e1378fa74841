"""The correctness gate: relative L2 error in float64, NaN handling, poisoning, per-output bounds."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.measure.verify import check_outputs, poison_, relative_l2
from tuner.template import OutputSpec


def test_relative_l2_in_float64() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert relative_l2(ref.clone(), ref) == 0.0
    assert relative_l2(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5.0)
    # norms of large float32 values overflow in float32, not in float64
    big = torch.full((4,), 3.0e38)
    assert relative_l2(big * (1 + 2**-10), big) == pytest.approx(2**-10, rel=1e-3)
    assert relative_l2(torch.ones(4, dtype=torch.bfloat16), torch.ones(4)) == 0.0


def test_nan_anywhere_is_an_infinite_error() -> None:
    ref = torch.arange(1.0, 1001.0)
    out = ref.clone()
    out[500] = float("nan")
    assert relative_l2(out, ref) == math.inf
    assert relative_l2(ref.clone(), torch.where(ref == 7.0, float("nan"), ref)) == math.inf


def test_zero_reference_and_infinities() -> None:
    zeros = torch.zeros(5)
    assert relative_l2(torch.zeros(5), zeros) == 0.0
    assert relative_l2(torch.ones(5), zeros) == math.inf
    out = torch.ones(5)
    out[2] = float("inf")
    assert relative_l2(out, torch.ones(5)) == math.inf


def test_shape_mismatch_is_a_template_bug() -> None:
    with pytest.raises(ValueError, match="shape"):
        relative_l2(torch.zeros(3), torch.zeros(4))


def test_poison_makes_every_element_differ() -> None:
    ref_f = torch.randn(16)
    out_f = torch.empty(16)
    poison_(out_f, ref_f)
    assert bool(torch.isnan(out_f).all())

    ref_i = torch.randint(-5, 5, (16,), dtype=torch.int32)
    out_i = torch.empty(16, dtype=torch.int32)
    poison_(out_i, ref_i)
    assert bool((out_i != ref_i).all())

    ref_b = torch.rand(16) > 0.5
    out_b = torch.empty(16, dtype=torch.bool)
    poison_(out_b, ref_b)
    assert bool((out_b != ref_b).all())
    assert relative_l2(out_b, ref_b) > 0.5 or not bool(ref_b.any())


def test_check_outputs_names_the_worst_output() -> None:
    ref = {"a": torch.ones(10), "b": torch.ones(10), "c": torch.ones(10)}
    out = {"a": torch.ones(10), "b": torch.ones(10) * 1.01, "c": torch.ones(10) * 1.5}
    specs = (OutputSpec("a", 1e-6), OutputSpec("b", 1e-3), OutputSpec("c", 0.1))
    verdict = check_outputs(out, ref, specs)
    assert not verdict.ok
    assert verdict.errors["a"] == 0.0
    assert verdict.errors["b"] == pytest.approx(0.01) and verdict.errors["c"] == pytest.approx(0.5)
    # b is 10× over its bound, c 5×: b is the worst
    assert "'b'" in verdict.failure and "1 other" in verdict.failure

    assert check_outputs({"a": torch.ones(3)}, {"a": torch.ones(3)}, (OutputSpec("a", 0.0),)).ok
    with pytest.raises(ValueError, match="missing"):
        check_outputs({}, ref, (OutputSpec("a"),))
