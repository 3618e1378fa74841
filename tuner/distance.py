"""How far apart two shapes of one template are: the distance of the nearest-shape fallback.

The lookup (server and client alike) serves, for a shape without its own best config, the config of the
nearest shape that has one; the warm starts of a new study seed it from its nearest neighbours too.
A :class:`ShapeDistance` adds one term per dim of the two shapes:

* integer dims: ``weight × |log2(a / b)|`` — doubling a dim costs its weight, whatever its size
  (weight 1 unless ``weights`` names the dim); non-positive values must be equal;
* dtype dims (both values named in :data:`DTYPE_BITS`): 0 when equal, ``dtype_cost`` when the two dtypes
  have the same width (``float16`` and ``bfloat16``: the kernel moves the same bytes), not comparable when
  the widths differ or ``dtype_cost`` is None;
* other dims (flags, strings): 0 when equal, ``flag_cost`` otherwise (None: not comparable);
* optionally ``size_weight × |log2(size_a / size_b)|``, the size being the product of the integer dims (a
  proxy for the work: the elements a kernel of these shapes touches).

Weights learnt from the published bests (``learn``, :meth:`ShapeDistance.fitted`): a dim whose changes
change the best config counts more than one whose changes leave it alone. Among the bests of shapes that
differ in that dim only (each shape with the next one along that dim), the share of config parameters that
differ, per doubling, averaged; each dim's average over the mean of all dims' averages is its weight (at
least ``weight_floor``); dims without such a pair keep their given weight. E.g. over the Mamba3 MIMO bests,
changing the state size N never changed the best config while the head dim P and the rank R did: N weighs
``weight_floor`` (0.1), P 1.1 and R 1.9. Fitting needs the neighbours' configs: the lookup fits over the
entries it chooses from, the warm starts over the neighbours' bests, so server, client and driver agree.

``max_distance``: the lookup serves no entry farther than this; the template's default is served instead
(the warm starts still order every neighbour). The default distance's is 6; beyond 3, the lookup's gain gate
asks more of a farther entry (:func:`tuner.lookup.required_gain`). Shapes with different dim names, or
with a dim that is not comparable, are at an infinite distance: no config is served across them.
:data:`DEFAULT_DISTANCE` is the one the lookup uses; it was chosen with ``tuner regret`` over the committed
H200 stores (``benchmarks/regret.md`` holds the figures and the command). Pure Python; instances are immutable and
thread-safe.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
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
    size_weight: float = 0.0
    dim_weight: float = 1.0  # integer dims not named in ``weights``
    learn: bool = False
    weight_floor: float = 0.1
    max_distance: float = math.inf
    fitted_on: int | None = None  # set by fitted(): how many (shape, config) examples the weights came from

    def __call__(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        """The distance of ``a`` and ``b``; ``math.inf`` when they are not comparable. Never raises."""
        if set(a) != set(b):
            return math.inf
        total = 0.0
        for name, av in a.items():
            total += self._term(name, av, b[name])
            if math.isinf(total):
                return total
        if self.size_weight:
            sizes = [math.prod(v for v in s.values() if _is_int(v)) for s in (a, b)]
            total += self.size_weight * abs(math.log2(sizes[0] / sizes[1]))
        return total

    def fitted(self, examples: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> ShapeDistance:
        """This distance with the weights learnt from ``examples`` (shape, best config) when ``learn`` is set
        (see the module docstring), else itself. The result is fitted for good (``learn`` off, ``fitted_on``
        the number of examples): fitting it again returns it unchanged, so a caller that answers many lookups
        over one set of entries fits once and passes the result on. Never raises."""
        if not self.learn:
            return self
        pairs = list(examples)
        learnt = learn_weights(pairs, floor=self.weight_floor)
        return replace(self, weights={**self.weights, **learnt}, learn=False, fitted_on=len(pairs))

    def _term(self, name: str, av: Any, bv: Any) -> float:
        if av == bv and type(av) is type(bv):
            return 0.0
        if _is_int(av) and _is_int(bv):
            if av <= 0 or bv <= 0:
                return math.inf
            return self.weights.get(name, self.dim_weight) * abs(math.log2(av / bv))
        if isinstance(av, str) and isinstance(bv, str) and av in DTYPE_BITS and bv in DTYPE_BITS:
            same_width = DTYPE_BITS[av] == DTYPE_BITS[bv]
            return self.dtype_cost if same_width and self.dtype_cost is not None else math.inf
        return self.flag_cost if self.flag_cost is not None else math.inf

    def describe(self) -> str:
        """One line for reports: what each kind of difference costs."""
        weights = ", ".join(f"{k}×{v:g}" for k, v in sorted(self.weights.items()))
        learnt = "weights learnt from the bests, " if self.learn or self.fitted_on is not None else ""
        parts = [
            f"Σ {learnt}weight × abs(log2 ratio) over integer dims"
            f"{f' ({weights}, others ×{self.dim_weight:g})' if weights else ''}"
            f"{f' (×{self.dim_weight:g})' if not weights and self.dim_weight != 1 else ''}",
            *([f"{self.size_weight:g} × abs(log2 ratio) of the sizes (products of the integer dims)"]
              if self.size_weight else []),
            "equal-width dtypes " + (f"cost {self.dtype_cost:g}" if self.dtype_cost is not None else "not comparable"),
            "other dims " + (f"cost {self.flag_cost:g} when they differ" if self.flag_cost is not None
                             else "must be equal"),
            *([f"nothing served beyond {self.max_distance:g}"] if not math.isinf(self.max_distance) else []),
        ]
        return "; ".join(parts)


def learn_weights(
    examples: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], *, floor: float = 0.1
) -> dict[str, float]:
    """Integer dims' weights from (shape, best config) pairs: see the module docstring. Empty when no pair of
    shapes differs in one integer dim only, or when no such change changed a config. Never raises."""
    pairs = [(dict(shape), dict(config)) for shape, config in examples]
    changes: dict[str, list[float]] = defaultdict(list)
    dims = {name for shape, _ in pairs for name, value in shape.items() if _is_int(value)}
    for dim in sorted(dims):
        along: dict[tuple[Any, ...], list[tuple[int, Mapping[str, Any]]]] = defaultdict(list)
        for shape, config in pairs:
            value = shape.get(dim)
            if isinstance(value, int) and _is_int(value) and value > 0:
                rest = tuple(sorted((k, repr(v)) for k, v in shape.items() if k != dim))
                along[rest].append((value, config))
        for line in along.values():
            line.sort(key=lambda vc: (vc[0], sorted((k, repr(v)) for k, v in vc[1].items())))
            for (a, ca), (b, cb) in itertools.pairwise(line):
                if a != b:
                    changes[dim].append(_config_change(ca, cb) / math.log2(b / a))
    means = {dim: statistics.fmean(v) for dim, v in changes.items()}
    ref = statistics.fmean(means.values()) if means else 0.0
    if ref <= 0:
        return {}
    return {dim: max(floor, m / ref) for dim, m in means.items()}


def _config_change(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """The share of parameters whose values differ between two configs (1 for two empty configs)."""
    names = set(a) | set(b)
    return sum(1 for n in names if a.get(n, _MISSING) != b.get(n, _MISSING)) / len(names) if names else 0.0


_MISSING = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The distances `benchmarks/regret.py` compares; the first is the one used before the regret measurement
# (any dtype or flag difference not comparable). The default was chosen by the lowest p90, then median,
# nearest-shape regret on the committed H200 stores (benchmarks/regret.md): "learnt+dtype+flags max3" on
# 2026-12-01. Since 2026-12-04 the lookup's gain gate grows beyond tuner.lookup.NEAR_DISTANCE (3), and the cap
# moved to 6: caps from 4 up give the same figures over the current versions, 6 bounds how far a config is
# carried. On today's stores the plain "log2+dtype+flags max6" scores one shape better over the current
# versions (+1.6% / p90 +5.4%, 4 above 5%, against +2.1% / +5.9%, 5 above): the two differ only in how they
# break ties between equally distant MIMO neighbours (N or P doubled), and over the older versions the learnt
# weights do better (p90 +5.8% against +8.5%, worst +10.7% against +27.8%). The learnt distance stays until a
# device session can re-measure what the other would change in the warm starts (tuner.driver.study orders
# them by this distance; benchmarks/search.md).
MAX_DISTANCE = 3.0
CAP = 6.0
CANDIDATES: tuple[ShapeDistance, ...] = (
    ShapeDistance("log2"),
    ShapeDistance("log2+dtype", dtype_cost=1.0),
    ShapeDistance("log2+dtype+flags", dtype_cost=1.0, flag_cost=1.0),
    ShapeDistance("log2+dtype+flags2", dtype_cost=1.0, flag_cost=2.0),
    ShapeDistance("log2+dtype0.5+flags0.5", dtype_cost=0.5, flag_cost=0.5),
    ShapeDistance("size+dtype+flags", dtype_cost=1.0, flag_cost=1.0, size_weight=1.0, dim_weight=0.25),
    ShapeDistance("log2+dtype+flags max3", dtype_cost=1.0, flag_cost=1.0, max_distance=MAX_DISTANCE),
    ShapeDistance("log2+dtype+flags max6", dtype_cost=1.0, flag_cost=1.0, max_distance=CAP),
    ShapeDistance("learnt+dtype+flags", dtype_cost=1.0, flag_cost=1.0, learn=True),
    ShapeDistance("learnt+dtype+flags max3", dtype_cost=1.0, flag_cost=1.0, learn=True, max_distance=MAX_DISTANCE),
    ShapeDistance("learnt+dtype+flags max6", dtype_cost=1.0, flag_cost=1.0, learn=True, max_distance=CAP),
)
DEFAULT_DISTANCE = CANDIDATES[-1]


def candidate(name: str) -> ShapeDistance:
    """The candidate distance called ``name``; KeyError (listing the names) if there is none."""
    for d in CANDIDATES:
        if d.name == name:
            return d
    raise KeyError(f"no distance {name!r}; one of {', '.join(d.name for d in CANDIDATES)}")
