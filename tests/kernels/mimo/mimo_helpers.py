"""Shared by the MIMO tests: shapes, relative errors."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tuner.frozen import Shape
from tuner.kernels.mamba3_mimo.bwd_template import Mamba3MimoBwd
from tuner.measure.verify import relative_l2

TEMPLATE = Mamba3MimoBwd()


def tiny(**dims: int | str) -> Shape:
    """A shape small enough for the interpreter (override any dim)."""
    base: dict[str, int | str] = {"B": 1, "S": 32, "H": 2, "G": 1, "N": 16, "P": 16, "R": 2}
    return TEMPLATE.make_shape({**base, **dims})


def errors(outs: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Relative L2 error of every output named by ``refs`` (the gate's measure: NaN anywhere is ``inf``)."""
    return {name: relative_l2(outs[name], refs[name]) for name in refs}
