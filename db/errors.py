"""Errors of the store's callers (:mod:`tuner.errors`), named here too for ``db`` users."""

from __future__ import annotations

from tuner.errors import RecordConflictError, RecordRejectedError, SlotLostError

__all__ = ["RecordConflictError", "RecordRejectedError", "SlotLostError"]
