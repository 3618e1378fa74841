"""Ids bound in IN lists, a bounded number per statement: PostgreSQL refuses a statement binding more than
65 535 parameters, and a read that binds one parameter per id (a page of 500 jobs lists more tasks than that;
the template page reads every study of a template) sends one statement per chunk and merges the answers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

_T = TypeVar("_T")

IN_CHUNK = 10_000  # ids bound in one IN list; a read may bind a few lists of this size in one statement


def in_chunks(ids: Iterable[_T]) -> Iterator[list[_T]]:
    """The distinct ``ids`` in the order they first come, in lists of at most :data:`IN_CHUNK` (read when the
    iteration starts); nothing for no ids."""
    distinct = list(dict.fromkeys(ids))
    size = IN_CHUNK
    for start in range(0, len(distinct), size):
        yield distinct[start:start + size]
