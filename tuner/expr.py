"""Safe evaluation of constraint expressions over parameters and shape dims.

Constraints in search-space files are Python-like expressions such as ``BLOCK_H * CHUNK <= 16384`` or
``S % CHUNK == 0 and num_warps <= BLOCK_H * 4``. Only literals, names, arithmetic, comparisons, boolean
operators, conditional expressions, tuples/lists for ``in`` and a few pure functions are allowed; anything
else (attributes, subscripts, lambdas, comprehensions, other calls) is rejected when the file is loaded.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "log2": math.log2,
    "ceil_div": lambda a, b: -(-a // b),
    "is_pow2": lambda x: isinstance(x, int) and x > 0 and x & (x - 1) == 0,
    "itemsize": lambda dtype: {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[str(dtype)],
}

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
    ast.Load, ast.Constant, ast.Tuple, ast.List, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift,
    ast.BitAnd, ast.BitOr, ast.BitXor, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In,
    ast.NotIn,
)


class ExpressionError(ValueError):
    """An expression is not in the allowed subset, names an unknown variable, or failed to evaluate."""


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression. Immutable and thread-safe; evaluate with :meth:`evaluate`."""

    source: str
    names: frozenset[str]
    _code: Any

    @classmethod
    def parse(cls, source: str, known_names: frozenset[str] | None = None) -> Expression:
        """Parse and check ``source``; ExpressionError names the offending construct or variable."""
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"syntax error in {source!r}: {exc.msg}") from None
        names: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise ExpressionError(f"{type(node).__name__} is not allowed in {source!r}")
            if isinstance(node, ast.Call):
                if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS) or node.keywords:
                    raise ExpressionError(
                        f"only calls to {', '.join(sorted(FUNCTIONS))} are allowed in {source!r}"
                    )
            elif isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        if known_names is not None:
            unknown = sorted(names - known_names)
            if unknown:
                raise ExpressionError(f"unknown name(s) {', '.join(unknown)} in {source!r}")
        code = compile(tree, "<constraint>", "eval")
        return cls(source=source, names=frozenset(names), _code=code)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with the given variables; ExpressionError if one is missing or evaluation fails."""
        missing = sorted(self.names - set(env))
        if missing:
            raise ExpressionError(f"{self.source!r} needs {', '.join(missing)}")
        scope = {**FUNCTIONS, **{n: env[n] for n in self.names}}
        try:
            return eval(self._code, {"__builtins__": {}}, scope)
        except Exception as exc:  # arithmetic errors of user expressions, e.g. division by zero
            raise ExpressionError(f"{self.source!r} failed: {exc}") from exc
