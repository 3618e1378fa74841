"""Per-kernel medians of a timed candidate (what a CUPTI measurement stores beside its total)."""

from __future__ import annotations

from tuner.measure.child import MAX_KERNEL_NAMES, OTHER_KERNELS, kernel_medians


def test_medians_longest_first() -> None:
    medians = kernel_medians({"a": [1.0, 3.0, 2.0], "b": [5.0, 4.0, 6.0], "c": [0.0, 0.0, 1.0]})
    assert list(medians.items()) == [("b", 5.0), ("a", 2.0), ("c", 0.0)]


def test_names_beyond_the_cap_are_folded_into_one_entry() -> None:
    per_sample = {f"k{i}": [float(i)] for i in range(MAX_KERNEL_NAMES + 3)}
    medians = kernel_medians(per_sample)
    assert len(medians) == MAX_KERNEL_NAMES + 1
    assert medians[OTHER_KERNELS] == 0.0 + 1.0 + 2.0  # the three shortest
    assert f"k{MAX_KERNEL_NAMES + 2}" in medians
