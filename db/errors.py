"""Errors of the store's callers: :class:`tuner.errors.RecordConflictError` and :class:`tuner.errors.RecordRejectedError`, named here too for ``db`` users."""

from __future__ import annotations

from tuner.errors import RecordConflictError, RecordRejectedError

__all__ = ["RecordConflictError", "RecordRejectedError"]
