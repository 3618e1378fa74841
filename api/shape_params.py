"""Shapes in query strings: ``shape=B=1,S=4096,H=48``, or one query parameter per dim (``B=1&S=4096&H=48``)."""

from __future__ import annotations

from collections.abc import Iterable

from tuner.api.errors import FieldError
from tuner.errors import ShapeError
from tuner.shapes import parse_shape_text


def raw_shape(text: str | None, params: Iterable[tuple[str, str]], reserved: frozenset[str]) -> dict[str, object]:
    """Dims from ``shape=`` and from the query parameters not in ``reserved`` (types are checked later by the
    template's ``make_shape``); FieldError for malformed text or a dim given both ways."""
    try:
        raw: dict[str, object] = dict(parse_shape_text(text)) if text else {}
    except ShapeError as exc:
        raise FieldError.wrap(exc, ("query", "shape")) from None
    for name, value in params:
        if name in reserved:
            continue
        if name in raw:
            raise FieldError(f"shape dim {name} is given twice", ("query", name))
        raw[name] = value
    return raw
