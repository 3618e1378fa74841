"""The SQL store: tuner's tables beside Optuna's in one database (SQLite file or PostgreSQL).

``Store.open(url)`` connects and migrates; ``store.session()`` is the one transaction scope that
commits, rolls back and turns database errors into :class:`tuner.errors.StoreError`; the repository
functions (re-exported here, see :mod:`db.repository` for their shared conventions) take that session
and return frozen records. The store knows strings, JSON and numbers, not templates or devices.
"""

from __future__ import annotations

from db.engine import Store, default_path, default_url, mask_url, optuna_storage_url, sqlite_url
from db.errors import RecordConflictError
from db.records import BestRecord, MeasurementRecord, StudyRecord
from db.repository import (
    add_measurement,
    add_result,
    count_measurements,
    get_best,
    get_measurement,
    get_or_create_study,
    get_study,
    get_study_best,
    latest_round,
    list_best,
    list_measurements,
    list_studies,
    measurement_fields,
    publish_best,
    worker_id,
)

__all__ = [
    "BestRecord",
    "MeasurementRecord",
    "RecordConflictError",
    "Store",
    "StudyRecord",
    "add_measurement",
    "add_result",
    "count_measurements",
    "default_path",
    "default_url",
    "get_best",
    "get_measurement",
    "get_or_create_study",
    "get_study",
    "get_study_best",
    "latest_round",
    "list_best",
    "list_measurements",
    "list_studies",
    "mask_url",
    "measurement_fields",
    "optuna_storage_url",
    "publish_best",
    "sqlite_url",
    "worker_id",
]
