"""All repository functions in one namespace (``from db import repository as repo``).

Conventions shared by every function: a :class:`sqlalchemy.orm.Session` from
:meth:`db.Store.session` comes first, everything else is keyword-only; results are frozen records
from :mod:`tuner.store.records`; lookups (``get_*``, ``list_*``, ``latest_round``) return None or an empty list
when nothing matches; writes that name a row by id raise :class:`tuner.errors.NotFoundError` when it
does not exist and :class:`tuner.db.errors.RecordConflictError` when the stored state forbids them; invalid
arguments raise ValueError. Database failures surface as StoreError from the session scope.
"""

from __future__ import annotations

from tuner.db.best import get_best, get_study_best, list_best, publish_best, withdraw_best
from tuner.db.measurements import (
    add_measurement,
    add_new,
    count_measurements,
    get_measurement,
    latest_round,
    list_measurements,
)
from tuner.db.studies import get_or_create_study, get_study, list_studies
from tuner.db.verifications import add_verification, latest_verification, latest_verifications, list_verifications

__all__ = [
    "add_measurement",
    "add_new",
    "add_verification",
    "count_measurements",
    "get_best",
    "get_measurement",
    "get_or_create_study",
    "get_study",
    "get_study_best",
    "latest_round",
    "latest_verification",
    "latest_verifications",
    "list_best",
    "list_measurements",
    "list_studies",
    "list_verifications",
    "publish_best",
    "withdraw_best",
]
