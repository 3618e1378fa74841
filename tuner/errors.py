"""One exception root for the whole project, with narrow subclasses.

Candidate failures (a kernel that does not compile, crashes, hangs or computes wrong values) are *not*
exceptions: they are :class:`tuner.results.MeasureResult` values with a status. The classes here are for
errors of the caller or of the infrastructure, each translated once at its layer's boundary.
"""

from __future__ import annotations


class TunerError(Exception):
    """Root of every error tuner raises on purpose."""


class UserInputError(TunerError):
    """Something the user gave is wrong; the message names it. The CLI exits with code 2."""


class UnknownTemplateError(UserInputError):
    """No template of that name in the registry."""


class TemplateImportError(UnknownTemplateError, ImportError):
    """A registered template's ``package.module:Name`` does not import (no such module, no such name, or
    not a template). An ImportError too, for callers that load import paths of their own."""


class UnknownWorkloadError(UserInputError):
    """The template declares no workload of that name."""


class ShapeError(UserInputError):
    """A shape is malformed (unknown dim, wrong type) or inconsistent with the template (e.g. S % Q != 0)."""


class ConfigError(UserInputError):
    """A config names unknown parameters, or values outside the search space."""


class SearchSpaceError(UserInputError):
    """A search-space file is invalid; the message names the file and the offending key."""


class StoreError(TunerError):
    """The database could not be reached or refused an operation (raised by store implementations only)."""


class NotFoundError(TunerError):
    """A looked-up record (job, best config, study) does not exist."""


class RecordConflictError(TunerError, ValueError):
    """A write contradicts what is stored, so the store refuses it; nothing was written.

    Raised, for example, when publishing a measurement that is not OK, or that belongs to another study,
    or when a study name is already taken by a different key. It is a ValueError too: the arguments are
    wrong for the stored state, retrying will not help.
    """


class SlotLostError(RecordConflictError):
    """A reserved trial slot no longer exists: its worker was declared lost and the slot given back."""


class RecordRejectedError(UserInputError, ValueError):
    """The database refused a value as data: a number out of its column's range, text with a NUL byte or
    an unencodable character, a string longer than its column. Nothing was written; the same values will be
    refused again (this is the caller's input, not an outage: :class:`StoreError` is that)."""


class DeviceError(TunerError):
    """A device backend is unavailable or failed outside any candidate (driver, profiler, allocation)."""


class MeasureSetupError(TunerError):
    """A measurement could not be set up for reasons outside the candidate: the template does not import,
    its inputs or reference raise, a measurement worker cannot start, or a comparator is unknown."""


class MeasureInterrupted(TunerError):
    """A measurement was ended from outside (the worker is stopping): it has no result, and its candidate
    is to be measured again, not recorded as failed."""
