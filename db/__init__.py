"""The SQL store: tuner's tables beside Optuna's in one database (SQLite file or PostgreSQL).

``Store.open(url)`` connects and migrates; a ``Store`` implements the engine's store protocols
(:mod:`tuner.store.protocols`), one transaction per method. Inside, ``store.session()`` is the one
transaction scope that commits, rolls back and turns database errors into :class:`tuner.errors.StoreError`;
the repository functions (re-exported here, see :mod:`tuner.db.repository` for their shared conventions)
take that session and return frozen records. The store knows strings, JSON and numbers, not templates or
devices: it imports nothing of the engine but the store contract (:mod:`tuner.store`) and the errors.
"""

from __future__ import annotations

from tuner.db.engine import Store, default_path, default_url, mask_url, optuna_storage_url, sqlite_url
from tuner.db.errors import RecordConflictError, RecordRejectedError, SlotLostError
from tuner.db.jobs import (
    attach_study,
    begin_finalize,
    cancel_job,
    claim_task,
    complete_slot,
    count_jobs,
    create_job,
    fail_task,
    finish_task,
    get_job,
    get_task,
    heartbeat,
    job_state,
    list_jobs,
    list_workers,
    reap_lost_workers,
    register_worker,
    rejoin_worker,
    release_slot,
    release_task,
    reserve_slot,
    stop_worker,
)
from tuner.db.repository import (
    add_measurement,
    add_new,
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
    publish_best,
)
from tuner.db.settings import StoreSettings, store_settings
from tuner.store.records import (
    BestRecord,
    Claim,
    JobRecord,
    MeasurementRecord,
    NewMeasurement,
    StudyRecord,
    TaskRecord,
    WorkerRecord,
)

__all__ = [
    "BestRecord",
    "Claim",
    "JobRecord",
    "MeasurementRecord",
    "NewMeasurement",
    "RecordConflictError",
    "RecordRejectedError",
    "SlotLostError",
    "Store",
    "StoreSettings",
    "StudyRecord",
    "TaskRecord",
    "WorkerRecord",
    "add_measurement",
    "add_new",
    "attach_study",
    "begin_finalize",
    "cancel_job",
    "claim_task",
    "complete_slot",
    "count_jobs",
    "count_measurements",
    "create_job",
    "default_path",
    "default_url",
    "fail_task",
    "finish_task",
    "get_best",
    "get_job",
    "get_measurement",
    "get_or_create_study",
    "get_study",
    "get_study_best",
    "get_task",
    "heartbeat",
    "job_state",
    "latest_round",
    "list_best",
    "list_jobs",
    "list_measurements",
    "list_studies",
    "list_workers",
    "mask_url",
    "optuna_storage_url",
    "publish_best",
    "reap_lost_workers",
    "register_worker",
    "rejoin_worker",
    "release_slot",
    "release_task",
    "reserve_slot",
    "sqlite_url",
    "stop_worker",
    "store_settings",
]
