from __future__ import annotations

import pytest

from tuner.expr import Expression, ExpressionError


def test_arithmetic_comparisons_and_functions() -> None:
    e = Expression.parse("BLOCK_H * CHUNK <= 16384 and S % CHUNK == 0 and is_pow2(BLOCK_H)")
    assert e.names == {"BLOCK_H", "CHUNK", "S"}
    assert e.evaluate({"BLOCK_H": 64, "CHUNK": 256, "S": 4096}) is True
    assert e.evaluate({"BLOCK_H": 128, "CHUNK": 256, "S": 4096}) is False
    assert e.evaluate({"BLOCK_H": 3, "CHUNK": 2, "S": 4}) is False


def test_membership_ternary_and_dtype_sizes() -> None:
    e = Expression.parse("(x if layout in ('rows', 'tiles') else 0) * itemsize(dtype) <= 8")
    assert e.evaluate({"x": 2, "layout": "rows", "dtype": "float32"}) is True
    assert e.evaluate({"x": 4, "layout": "rows", "dtype": "float32"}) is False
    assert e.evaluate({"x": 4, "layout": "heads", "dtype": "float32"}) is True


@pytest.mark.parametrize(
    "source",
    ["__import__('os')", "x.real", "x[0]", "(lambda: 1)()", "[i for i in x]", "open('f')", "x ="],
)
def test_rejects_anything_outside_the_subset(source: str) -> None:
    with pytest.raises(ExpressionError):
        Expression.parse(source)


def test_unknown_names_are_named() -> None:
    with pytest.raises(ExpressionError, match="BLOKC_H"):
        Expression.parse("BLOKC_H <= 4", frozenset({"BLOCK_H"}))


def test_missing_variable_and_runtime_error_are_expression_errors() -> None:
    e = Expression.parse("S // x > 0")
    with pytest.raises(ExpressionError, match="needs x"):
        e.evaluate({"S": 1})
    with pytest.raises(ExpressionError, match="failed"):
        e.evaluate({"S": 1, "x": 0})
