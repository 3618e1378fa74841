"""The store contract: protocols (:mod:`tuner.store.protocols`) and the values they speak
(:mod:`tuner.store.records`). ``tuner.db`` implements them on SQL; :mod:`tuner.store.memory` in memory."""

from __future__ import annotations

from tuner.store.protocols import JobQueue, TrialHeartbeats, TuningStore
from tuner.store.records import (
    BestRecord,
    Claim,
    Disproval,
    JobRecord,
    MeasurementRecord,
    NewMeasurement,
    RoundHold,
    StudyRecord,
    TaskAttemptRecord,
    TaskRecord,
    VerificationRecord,
    WorkerRecord,
)

__all__ = [
    "BestRecord",
    "Claim",
    "Disproval",
    "JobQueue",
    "JobRecord",
    "MeasurementRecord",
    "NewMeasurement",
    "RoundHold",
    "StudyRecord",
    "TaskAttemptRecord",
    "TaskRecord",
    "TrialHeartbeats",
    "TuningStore",
    "VerificationRecord",
    "WorkerRecord",
]
