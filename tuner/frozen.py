"""Immutable, hashable, canonically ordered mappings used for shapes and configs."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

Scalar = int | float | str | bool
_T = TypeVar("_T", bound="FrozenMap")


class FrozenMap(Mapping[str, Scalar]):
    """A read-only mapping of names to scalars, ordered by name, hashable and JSON-serialisable.

    Two maps with the same items are equal and hash alike whatever the insertion order, so they can
    be used in cache and database keys. Instances never change after construction (thread-safe).
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, Scalar] | None = None, /, **kwargs: Scalar) -> None:
        merged = dict(items or {}, **kwargs)
        for name, value in merged.items():
            if not isinstance(name, str):
                raise TypeError(f"keys must be str, got {name!r}")
            if not isinstance(value, (int, float, str, bool)):
                raise TypeError(f"{name}: values must be int, float, str or bool, got {type(value).__name__}")
        self._items: tuple[tuple[str, Scalar], ...] = tuple(sorted(merged.items()))
        self._hash = hash((type(self).__name__, self._items))

    def __getitem__(self, key: str) -> Scalar:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, Scalar]]]:
        # Rebuild on unpickling: the cached hash depends on the process's string-hash seed.
        return (type(self), (dict(self._items),))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key()})"

    def key(self) -> str:
        """Canonical text form ``a=1,b=x,c=true``, sorted by name; stable across processes."""
        return ",".join(f"{k}={scalar_text(v)}" for k, v in self._items)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces)."""
        return json.dumps(dict(self._items), sort_keys=True, separators=(",", ":"))

    def to_dict(self) -> dict[str, Scalar]:
        return dict(self._items)

    def replace(self: _T, **changes: Scalar) -> _T:
        return type(self)({**dict(self._items), **changes})

    @classmethod
    def from_json(cls: type[_T], text: str) -> _T:
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object")
        return cls(data)


def scalar_text(value: Scalar) -> str:
    """A dim's or parameter's value as shapes' keys (and the API's query strings) spell it: bools as
    ``true``/``false``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Shape(FrozenMap):
    """The problem a kernel is tuned for: every dim, dtype and flag that changes the kernel."""

    __slots__ = ()


class Config(FrozenMap):
    """One point of a search space: parameter name to value."""

    __slots__ = ()
