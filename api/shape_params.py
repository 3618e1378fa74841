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


def software_versions(text: str | None) -> dict[str, str]:
    """``software=driver=550.54,runtime=12.4,torch=2.5.1`` → ``{"driver": "550.54", …}``; FieldError if
    malformed. None or empty: ``{}`` (software not compared)."""
    found: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, version = (x.strip() for x in part.partition("="))
        if not sep or not name or not version or name in found:
            raise FieldError(f"malformed software {text!r}: expected distinct NAME=VERSION pairs separated by "
                             "commas, such as driver=550.54.15,runtime=12.4,torch=2.5.1", ("query", "software"))
        found[name] = version
    return found
