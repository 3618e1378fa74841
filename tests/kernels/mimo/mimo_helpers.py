"""Shared by the MIMO tests: shapes, relative errors."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.mamba3_mimo_bwd import Mamba3MimoBwd
from tuner.frozen import Shape

TEMPLATE = Mamba3MimoBwd()


def tiny(**dims: int | str) -> Shape:
    """A shape small enough for the interpreter (override any dim)."""
    base: dict[str, int | str] = {"B": 1, "S": 32, "H": 2, "G": 1, "N": 16, "P": 16, "R": 2}
    return TEMPLATE.make_shape({**base, **dims})


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out64 - ref64).norm() / ref64.norm())


def errors(outs: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor]) -> dict[str, float]:
    return {name: rel_err(outs[name], refs[name]) for name in refs}
