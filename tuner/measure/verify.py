"""The correctness gate: poison outputs before a checked run, then compare them with the reference.

Error measure: relative L2, ``‖out − ref‖₂ / ‖ref‖₂``, computed in float64 (complex128 for complex outputs).
A NaN anywhere (output or reference) makes the error infinite; so does a non-zero difference against an
all-zero reference. Functions here never keep state; they raise ValueError for template bugs (an output
missing from the reference, mismatched shapes), which are not failures of the candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.template import OutputSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Verdict:
    """The errors of every compared output and, when some output is over its bound, why it failed."""

    errors: Mapping[str, float]
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def poison_(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Fill ``out`` with values the kernel must overwrite: NaN for floating outputs; for integer and bool
    outputs, the bitwise complement of the reference, so that every unwritten element differs from it."""
    import torch

    if out.is_floating_point() or out.is_complex():
        out.fill_(float("nan"))
    elif out.shape == ref.shape:
        if out.dtype == torch.bool:
            out.copy_(~ref.to(torch.bool))
        else:
            out.copy_(torch.bitwise_not(ref.to(out.dtype)))
    else:  # the comparison will reject the shapes; still leave no stale values behind
        out.fill_(1 if out.dtype == torch.bool else torch.iinfo(out.dtype).max)


def relative_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖₂ / ‖ref‖₂`` in float64; ``inf`` on NaN anywhere or on x/0 with x ≠ 0; 0 when both are 0.

    Raises ValueError when the shapes differ.
    """
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    wide = torch.complex128 if (out.is_complex() or ref.is_complex()) else torch.float64
    o = out.detach().to(wide)
    r = ref.detach().to(device=o.device, dtype=wide)
    if bool(torch.isnan(o).any()) or bool(torch.isnan(r).any()):
        return math.inf
    diff = float(torch.linalg.vector_norm(o - r))
    norm = float(torch.linalg.vector_norm(r))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    error = diff / norm
    return error if math.isfinite(error) else math.inf


def check_outputs(
    outputs: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], specs: Sequence[OutputSpec]
) -> Verdict:
    """Compare every output named by ``specs`` with its reference against the spec's ``rtol``.

    The failure names the output furthest over its bound. Raises ValueError if an output or its reference is
    missing, or if shapes differ (a template bug).
    """
    errors: dict[str, float] = {}
    for spec in specs:
        if spec.name not in outputs or spec.name not in reference:
            raise ValueError(f"output {spec.name!r} is missing from the outputs or from the reference")
        errors[spec.name] = relative_l2(outputs[spec.name], reference[spec.name])
    bounds = {spec.name: spec.rtol for spec in specs}
    over = [name for name, error in errors.items() if not error <= bounds[name]]
    if not over:
        return Verdict(errors)
    worst = max(over, key=lambda name: errors[name] / bounds[name] if bounds[name] > 0 else math.inf)
    failure = f"output {worst!r}: relative L2 error {errors[worst]:.3g} exceeds its bound {bounds[worst]:g}"
    if len(over) > 1:
        failure += f" ({len(over) - 1} other output(s) over their bounds too)"
    return Verdict(errors, failure)
