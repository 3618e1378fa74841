"""How far apart two shapes of one template are: the distance of the nearest-shape fallback.

The lookup (server and client alike) serves, for a shape without its own best config, the config of the
nearest shape that has one; the warm starts of a new study seed it from its nearest neighbours too.
A :class:`ShapeDistance` adds one term per dim of the two shapes:

* integer dims: ``weight × |log2(a / b)|`` — doubling a dim costs its weight, whatever its size
  (weight 1 unless ``weights`` names the dim); non-positive values must be equal;
* dtype dims (both values named in :data:`DTYPE_BITS`): 0 when equal, ``dtype_cost`` when the two dtypes
  have the same width (``float16`` and ``bfloat16``: the kernel moves the same bytes), not comparable when
  the widths differ or ``dtype_cost`` is None;
* other dims (flags, strings): 0 when equal, ``flag_cost`` otherwise (None: not comparable).

Shapes with different dim names, or with a dim that is not comparable, are at an infinite distance: no
config is served across them. :data:`DEFAULT_DISTANCE` is the one the lookup uses; it was chosen with
``tuner regret`` over the committed H200 stores (``benchmarks/regret.md`` holds the figures and the
command). Pure Python; instances are immutable and thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Bits per element of the dtype names templates use (torch's names without the ``torch.`` prefix).
DTYPE_BITS: Mapping[str, int] = {
    "float64": 64, "float32": 32, "tfloat32": 32, "float16": 16, "bfloat16": 16,
    "float8_e4m3fn": 8, "float8_e4m3fnuz": 8, "float8_e5m2": 8, "float8_e5m2fnuz": 8,
    "int64": 64, "int32": 32, "int16": 16, "int8": 8, "uint8": 8,
}


@dataclass(frozen=True)
class ShapeDistance:
    """A distance between shapes of one template (see the module docstring). Immutable."""

    name: str
    weights: Mapping[str, float] = field(default_factory=dict)
    dtype_cost: float | None = None
    flag_cost: float | None = None

    def __call__(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        """The distance of ``a`` and ``b``; ``math.inf`` when they are not comparable. Never raises."""
        if set(a) != set(b):
            return math.inf
        total = 0.0
        for name, av in a.items():
            total += self._term(name, av, b[name])
            if math.isinf(total):
                return total
        return total

    def _term(self, name: str, av: Any, bv: Any) -> float:
        if av == bv and type(av) is type(bv):
            return 0.0
        if _is_int(av) and _is_int(bv):
            if av <= 0 or bv <= 0:
                return math.inf
            return self.weights.get(name, 1.0) * abs(math.log2(av / bv))
        if isinstance(av, str) and isinstance(bv, str) and av in DTYPE_BITS and bv in DTYPE_BITS:
            same_width = DTYPE_BITS[av] == DTYPE_BITS[bv]
            return self.dtype_cost if same_width and self.dtype_cost is not None else math.inf
        return self.flag_cost if self.flag_cost is not None else math.inf

    def describe(self) -> str:
        """One line for reports: what each kind of difference costs."""
        weights = ", ".join(f"{k}×{v:g}" for k, v in sorted(self.weights.items()))
        parts = [
            f"Σ weight × abs(log2 ratio) over integer dims{f' ({weights}, others ×1)' if weights else ''}",
            "equal-width dtypes " + (f"cost {self.dtype_cost:g}" if self.dtype_cost is not None else "not comparable"),
            "other dims " + (f"cost {self.flag_cost:g} when they differ" if self.flag_cost is not None
                             else "must be equal"),
        ]
        return "; ".join(parts)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The distances `benchmarks/regret.py` compares; the first is the one used before the regret measurement
# (any dtype or flag difference not comparable). The default is the one with the lowest median and p90
# nearest-shape regret on the committed H200 stores (benchmarks/regret.md).
CANDIDATES: tuple[ShapeDistance, ...] = (
    ShapeDistance("log2"),
    ShapeDistance("log2+dtype", dtype_cost=1.0),
    ShapeDistance("log2+dtype+flags", dtype_cost=1.0, flag_cost=1.0),
    ShapeDistance("log2+dtype+flags2", dtype_cost=1.0, flag_cost=2.0),
    ShapeDistance("log2+dtype0.5+flags0.5", dtype_cost=0.5, flag_cost=0.5),
)
DEFAULT_DISTANCE = CANDIDATES[2]


def candidate(name: str) -> ShapeDistance:
    """The candidate distance called ``name``; KeyError (listing the names) if there is none."""
    for d in CANDIDATES:
        if d.name == name:
            return d
    raise KeyError(f"no distance {name!r}; one of {', '.join(d.name for d in CANDIDATES)}")
