"""Errors of the store's callers: :class:`tuner.errors.RecordConflictError`, named here too for ``db`` users."""

from __future__ import annotations

from tuner.errors import RecordConflictError

__all__ = ["RecordConflictError"]
