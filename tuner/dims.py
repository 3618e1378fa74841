"""A template's shape declaration — its dims and the rules a shape must satisfy — and the one function that
validates a raw shape against it.

Pure Python (no torch, no templates): the server validates with :meth:`KernelTemplate.make_shape`, the
runtime client with the dims and rules of an export file, and both call :func:`validate_shape`, so a shape
the server rejects (422) is rejected offline too, with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from tuner.errors import ShapeError
from tuner.expr import Expression, ExpressionError
from tuner.frozen import Scalar

MAX_INT_DIM = 2**31 - 1  # default maximum of an int dim
MAX_STR_DIM = 64  # characters of a str dim
MAX_ELEMENTS = 2**40  # default bound on a shape's size (the product of its int dims)


@dataclass(frozen=True)
class Dim:
    """One entry of a template's shape: a dimension, dtype or flag.

    ``kind`` is ``int``, ``bool`` or ``str`` (dtypes are str, e.g. ``bfloat16``); ``default`` of None means
    the dim is required; ``choices`` restricts str dims; ``minimum`` and ``maximum`` restrict int dims (the
    default maximum, 2**31 - 1, keeps every index a kernel computes from one dim within 32 bits); str dims
    hold at most ``MAX_STR_DIM`` characters.
    """

    name: str
    kind: Literal["int", "bool", "str"] = "int"
    default: Scalar | None = None
    choices: tuple[str, ...] | None = None
    minimum: int = 1
    doc: str = ""
    maximum: int = MAX_INT_DIM

    def coerce(self, raw: object) -> Scalar:
        """Turn a raw value (from a CLI string, JSON or Python) into this dim's type; ShapeError if not."""
        if self.kind == "int":
            return self._coerce_int(raw)
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in {"1", "true", "yes", "on"}:
                return True
            if text in {"0", "false", "no", "off"}:
                return False
            raise ShapeError(f"shape dim {self.name}: expected true/false, got {raw!r}")
        value_s = str(raw)
        if len(value_s) > MAX_STR_DIM:
            raise ShapeError(f"shape dim {self.name}: at most {MAX_STR_DIM} characters, got {len(value_s)}")
        if self.choices is not None and value_s not in self.choices:
            raise ShapeError(f"shape dim {self.name}: expected one of {', '.join(self.choices)}, got {raw!r}")
        return value_s

    def _coerce_int(self, raw: object) -> int:
        if isinstance(raw, bool):
            raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}")
        try:
            value = int(str(raw), 0) if isinstance(raw, str) else int(raw)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}") from None
        if isinstance(raw, float) and raw != value:
            raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}")
        if value < self.minimum:
            raise ShapeError(f"shape dim {self.name}: must be >= {self.minimum}, got {value}")
        if value > self.maximum:
            raise ShapeError(f"shape dim {self.name}: must be <= {self.maximum}, got {value}")
        return value

    def to_dict(self) -> dict[str, Any]:
        """The export file's form (``doc`` left out)."""
        return {"name": self.name, "kind": self.kind, "default": self.default,
                "choices": list(self.choices) if self.choices else None,
                "minimum": self.minimum if self.kind == "int" else None,
                "maximum": self.maximum if self.kind == "int" else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Dim:
        """The inverse of :meth:`to_dict`; KeyError/TypeError/ValueError for malformed data."""
        kind = data.get("kind", "int")
        if kind not in ("int", "bool", "str"):
            raise ValueError(f"dim {data.get('name')!r}: unknown kind {kind!r}")
        choices = data.get("choices")
        minimum, maximum = data.get("minimum"), data.get("maximum")
        return cls(str(data["name"]), kind, data.get("default"), tuple(choices) if choices else None,
                   int(minimum) if minimum is not None else 1,
                   maximum=int(maximum) if maximum is not None else MAX_INT_DIM)


@dataclass(frozen=True)
class ShapeRule:
    """A condition every shape of a template satisfies: a :mod:`tuner.expr` expression over its dims, and
    the message of the ShapeError raised when it does not hold (``{dim}`` placeholders are filled in)."""

    expr: str
    message: str

    def check(self, shape: Mapping[str, Scalar]) -> None:
        """ShapeError when the rule does not hold for ``shape`` (or cannot be evaluated on it)."""
        try:
            ok = _parsed(self.expr).evaluate(shape)
        except ExpressionError as exc:
            raise ShapeError(f"shape rule {self.expr!r} cannot be checked: {exc}") from None
        if not ok:
            try:
                text = self.message.format(**shape)
            except (KeyError, IndexError, ValueError):
                text = self.message
            raise ShapeError(text)

    def to_dict(self) -> dict[str, str]:
        return {"expr": self.expr, "message": self.message}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShapeRule:
        return cls(str(data["expr"]), str(data["message"]))


@lru_cache(maxsize=256)
def _parsed(source: str) -> Expression:
    return Expression.parse(source)


def validate_shape(
    template: str, dims: Sequence[Dim], rules: Sequence[ShapeRule], raw: Mapping[str, object],
    max_elements: int = MAX_ELEMENTS,
) -> dict[str, Scalar]:
    """Validate and complete a raw shape: reject unknown dims, coerce types, fill defaults, bound its size
    (the product of its int dims, at most ``max_elements``), check the rules.

    Returns the complete shape (every dim, typed). Raises ShapeError naming the first problem."""
    known = {d.name: d for d in dims}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ShapeError(f"unknown shape dim(s) {', '.join(unknown)} for {template}; known: {', '.join(known)}")
    values: dict[str, Scalar] = {}
    for dim in dims:
        if dim.name in raw:
            values[dim.name] = dim.coerce(raw[dim.name])
        elif dim.default is not None:
            values[dim.name] = dim.default
        else:
            raise ShapeError(f"shape dim {dim.name} is required for {template}")
    size = 1
    for dim in dims:
        if dim.kind == "int":
            size *= int(values[dim.name])
    if size > max_elements:
        raise ShapeError(f"shape too large for {template}: {size} elements, at most {max_elements}")
    for rule in rules:
        rule.check(values)
    return values
