"""Errors of the store's callers (as opposed to :class:`tuner.errors.StoreError`, the infrastructure's)."""

from __future__ import annotations

from tuner.errors import TunerError


class RecordConflictError(TunerError, ValueError):
    """A write contradicts what is stored, so the store refuses it; nothing was written.

    Raised, for example, when publishing a measurement that is not OK, or that belongs to another study,
    or when a study name is already taken by a different key. It is a ValueError too: the arguments are
    wrong for the stored state, retrying will not help.
    """
