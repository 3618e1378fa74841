"""The store protocols (:class:`tuner.store.TuningStore`, :class:`tuner.store.JobQueue`) on SQL.

Every method is one transaction of :meth:`tuner.db.Store.session` around one repository function (the
repository modules document the SQL: ``studies``, ``measurements``, ``best``, ``jobs``); reads use a
read-only session. Errors: those of the repository functions, and StoreError from the session scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from tuner.db import best, explore, jobs, measurements, optuna_tables, studies, verifications
from tuner.db.models import store_now
from tuner.store.protocols import JsonInput, TrialHeartbeats
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

if TYPE_CHECKING:
    import optuna


class StoreMethods:
    """Mixed into :class:`tuner.db.Store`, which provides ``session``, ``url`` and the Optuna URL."""

    def session(self, *, readonly: bool = False) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def _reading(self) -> AbstractContextManager[Session]:
        return self.session(readonly=True)

    # -- studies ----------------------------------------------------------------------------------------
    def get_or_create_study(
        self, *, name: str, template: str, template_version: str, shape_key: str, shape_json: JsonInput,
        device_kind: str, device_name: str, fingerprint_hash: str, fingerprint_json: JsonInput,
    ) -> StudyRecord:
        with self.session() as s:
            return studies.get_or_create_study(
                s, name=name, template=template, template_version=template_version, shape_key=shape_key,
                shape_json=shape_json, device_kind=device_kind, device_name=device_name,
                fingerprint_hash=fingerprint_hash, fingerprint_json=fingerprint_json,
            )

    def get_study(self, *, name: str | None = None, study_id: int | None = None) -> StudyRecord | None:
        with self._reading() as s:
            return studies.get_study(s, name=name, study_id=study_id)

    def list_studies(self, *, template: str | None = None, device_kind: str | None = None) -> list[StudyRecord]:
        with self._reading() as s:
            return studies.list_studies(s, template=template, device_kind=device_kind)

    # -- measurements -----------------------------------------------------------------------------------
    def record_measurement(self, measurement: NewMeasurement, *, slot_id: int | None = None) -> MeasurementRecord:
        if slot_id is not None and measurement.trial_number is None:
            raise ValueError("a trial slot is spent on a trial's measurement: trial_number is missing")
        with self.session() as s:
            if slot_id is not None:
                earlier = jobs.spent_on(s, slot_id=slot_id, study_id=measurement.study_id,
                                        trial_number=int(measurement.trial_number))  # type: ignore[arg-type]
                if earlier is not None:  # this write committed before and its reply was lost: nothing more
                    found = measurements.get_measurement(s, measurement_id=earlier)
                    assert found is not None
                    return found
            row = measurements.add_new(s, measurement)
            if slot_id is not None:
                jobs.complete_slot(
                    s, slot_id=slot_id, trial_number=int(measurement.trial_number),  # type: ignore[arg-type]
                    measurement_id=row.id, ok=row.ok, median_us=row.median_us, config_json=row.config_json,
                )
        return row

    def get_measurement(self, *, measurement_id: int) -> MeasurementRecord | None:
        with self._reading() as s:
            return measurements.get_measurement(s, measurement_id=measurement_id)

    def list_measurements(self, *, study_id: int, **filters: Any) -> list[MeasurementRecord]:
        with self._reading() as s:
            return measurements.list_measurements(s, study_id=study_id, **filters)

    def count_measurements(self, *, study_id: int, **filters: Any) -> int:
        with self._reading() as s:
            return measurements.count_measurements(s, study_id=study_id, **filters)

    def latest_round(self, *, study_id: int) -> list[MeasurementRecord]:
        with self._reading() as s:
            return measurements.latest_round(s, study_id=study_id)

    def round_defaults(self, *, measurement_ids: Sequence[int]) -> dict[int, float]:
        with self._reading() as s:
            return measurements.round_defaults(s, measurement_ids=measurement_ids)

    # -- best configs -----------------------------------------------------------------------------------
    def publish_best(self, *, study_id: int, measurement_id: int, published_at: datetime | None = None) -> BestRecord:
        with self.session() as s:
            return best.publish_best(s, study_id=study_id, measurement_id=measurement_id, published_at=published_at)

    def publish_unless_disproved(self, *, study_id: int, measurement_id: int,
                                 published_at: datetime | None = None,
                                 replacing: int | None = None, holding: RoundHold | None = None) -> BestRecord | None:
        with self.session() as s:
            return verifications.publish_unless_disproved(s, study_id=study_id, measurement_id=measurement_id,
                                                          published_at=published_at, replacing=replacing,
                                                          holding=holding)

    def get_best(self, *, template: str, shape_key: str, **filters: str | None) -> BestRecord | None:
        with self._reading() as s:
            return best.get_best(s, template=template, shape_key=shape_key, **filters)

    def get_study_best(self, *, study_id: int) -> BestRecord | None:
        with self._reading() as s:
            return best.get_study_best(s, study_id=study_id)

    def withdraw_best(self, *, study_id: int) -> bool:
        with self.session() as s:
            return best.withdraw_best(s, study_id=study_id)

    def list_best(
        self, *, template: str | None = None, device_kind: str | None = None, device_name: str | None = None
    ) -> list[BestRecord]:
        with self._reading() as s:
            return best.list_best(s, template=template, device_kind=device_kind, device_name=device_name)

    # -- the Optuna side ----------------------------------------------------------------------------------
    def optuna_storage(self, *, heartbeats: TrialHeartbeats | None = None) -> optuna.storages.BaseStorage:
        return optuna_tables.rdb_storage(self, heartbeats)  # type: ignore[arg-type]

    def withdraw_waiting_trials(self, trial_ids: Sequence[int]) -> set[int]:
        with self.session() as s:
            return optuna_tables.withdraw_waiting(s, trial_ids)

    # -- verifications ------------------------------------------------------------------------------------
    def add_verification(self, **fields: Any) -> VerificationRecord:
        with self.session() as s:
            return verifications.add_verification(s, **fields)

    def record_disproval(self, **fields: Any) -> Disproval | None:
        with self.session() as s:
            return verifications.record_disproval(s, **fields)

    def latest_verifications(self, *, study_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        with self._reading() as s:
            return verifications.latest_verifications(s, study_ids=study_ids)

    def disproved_configs(self, *, study_ids: Sequence[int]) -> dict[int, frozenset[str]]:
        with self._reading() as s:
            return verifications.disproved_configs(s, study_ids=study_ids)

    def list_verifications(
        self, *, study_id: int | None = None, template: str | None = None, limit: int = 100
    ) -> list[VerificationRecord]:
        with self._reading() as s:
            return verifications.list_verifications(s, study_id=study_id, template=template, limit=limit)

    # -- the job queue ------------------------------------------------------------------------------------
    def create_job(self, **fields: Any) -> JobRecord:
        with self.session() as s:
            return jobs.create_job(s, **fields)

    def create_verify_job(self, **fields: Any) -> JobRecord:
        with self.session() as s:
            return jobs.create_verify_job(s, **fields)

    def job_with_key(self, *, idempotency_key: str) -> JobRecord | None:
        with self._reading() as s:
            return jobs.job_with_key(s, idempotency_key=idempotency_key)

    def get_job(self, *, job_id: int) -> JobRecord | None:
        with self._reading() as s:
            return jobs.get_job(s, job_id=job_id)

    def list_jobs(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        with self._reading() as s:
            return jobs.list_jobs(s, state=state, limit=limit, offset=offset)

    def count_jobs(self, *, state: str | None = None) -> int:
        with self._reading() as s:
            return jobs.count_jobs(s, state=state)

    def cancel_job(self, *, job_id: int) -> JobRecord:
        with self.session() as s:
            return jobs.cancel_job(s, job_id=job_id)

    def register_worker(self, **fields: Any) -> WorkerRecord:
        with self.session() as s:
            return jobs.register_worker(s, **fields)

    def clock(self) -> datetime:
        with self._reading() as s:
            return store_now(s)

    def heartbeat(self, *, worker_id: str, lease_s: float) -> bool:
        with self.session() as s:
            return jobs.heartbeat(s, worker_id=worker_id, lease_s=lease_s)

    def rejoin_worker(self, *, worker_id: str, lease_s: float) -> bool:
        with self.session() as s:
            return jobs.rejoin_worker(s, worker_id=worker_id, lease_s=lease_s)

    def list_workers(self, *, include_stopped: bool = False) -> list[WorkerRecord]:
        with self._reading() as s:
            return jobs.list_workers(s, include_stopped=include_stopped)

    def stop_worker(self, *, worker_id: str) -> None:
        with self.session() as s:
            jobs.stop_worker(s, worker_id=worker_id)

    def reap_lost_workers(self, *, now: datetime | None = None) -> list[str]:
        with self.session() as s:
            return jobs.reap_lost_workers(s, now=now)

    def claim_task(
        self, *, worker_id: str, device_kind: str, device_name: str, backends: Sequence[str]
    ) -> Claim | None:
        with self.session() as s:
            return jobs.claim_task(s, worker_id=worker_id, device_kind=device_kind, device_name=device_name,
                                   backends=backends)

    def attach_study(self, *, task_id: int, study_id: int) -> None:
        with self.session() as s:
            jobs.attach_study(s, task_id=task_id, study_id=study_id)

    def reserve_slot(self, *, task_id: int, worker_id: str) -> int | None:
        with self.session() as s:
            return jobs.reserve_slot(s, task_id=task_id, worker_id=worker_id)

    def release_slot(self, *, slot_id: int) -> None:
        with self.session() as s:
            jobs.release_slot(s, slot_id=slot_id)

    def get_task(self, *, task_id: int) -> TaskRecord | None:
        with self._reading() as s:
            return jobs.get_task(s, task_id=task_id)

    def job_state(self, *, job_id: int) -> str | None:
        with self._reading() as s:
            return jobs.job_state(s, job_id=job_id)

    def begin_finalize(self, *, task_id: int, worker_id: str) -> bool:
        with self.session() as s:
            return jobs.begin_finalize(s, task_id=task_id, worker_id=worker_id)

    def end_search(self, *, task_id: int) -> bool:
        with self.session() as s:
            return jobs.end_search(s, task_id=task_id)

    def finish_task(
        self, *, task_id: int, worker_id: str, best_us: float | None, best_config_json: str | None,
        error: str | None = None, verification_id: int | None = None,
    ) -> JobRecord:
        with self.session() as s:
            return jobs.finish_task(s, task_id=task_id, worker_id=worker_id, best_us=best_us,
                                    best_config_json=best_config_json, error=error, verification_id=verification_id)

    def fail_task(self, *, task_id: int, error: str) -> None:
        with self.session() as s:
            jobs.fail_task(s, task_id=task_id, error=error)

    def release_task(self, *, worker_id: str) -> None:
        with self.session() as s:
            jobs.release_task(s, worker_id=worker_id)

    def fail_attempt(self, *, task_id: int, worker_id: str, reason: str) -> TaskRecord:
        with self.session() as s:
            return jobs.fail_attempt(s, task_id=task_id, worker_id=worker_id, reason=reason)

    def withdraw_template(self, *, worker_id: str, template: str, version: str) -> None:
        with self.session() as s:
            jobs.withdraw_template(s, worker_id=worker_id, template=template, version=version)

    def list_attempts(self, *, task_id: int) -> list[TaskAttemptRecord]:
        with self._reading() as s:
            return jobs.list_attempts(s, task_id=task_id)

    def attempts_by_task(self, *, task_ids: Sequence[int]) -> dict[int, list[TaskAttemptRecord]]:
        with self._reading() as s:
            return jobs.attempts_by_task(s, task_ids=task_ids)

    def verifications_by_task(self, *, task_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        with self._reading() as s:
            return jobs.verifications_by_task(s, task_ids=task_ids)


    # -- exploration (the pages, /v1/studies, tuner history/studies; see tuner.db.explore) --------------------
    def list_study_summaries(self, **filters: Any) -> tuple[list[explore.StudySummary], int]:
        with self._reading() as s:
            return explore.list_study_summaries(s, **filters)

    def get_study_summary(self, *, study_id: int) -> explore.StudySummary | None:
        with self._reading() as s:
            return explore.get_study_summary(s, study_id=study_id)

    def page_measurements(self, *, study_id: int, **filters: Any) -> explore.MeasurementPage:
        with self._reading() as s:
            return explore.page_measurements(s, study_id=study_id, **filters)

    def failure_groups(self, *, study_id: int) -> list[explore.FailureGroup]:
        with self._reading() as s:
            return explore.failure_groups(s, study_id=study_id)

    def device_totals(self) -> list[explore.DeviceTotals]:
        with self._reading() as s:
            return explore.device_totals(s)

    def study_outcomes(self, *, study_ids: Sequence[int]) -> dict[int, explore.StudyOutcome]:
        with self._reading() as s:
            return explore.study_outcomes(s, study_ids=study_ids)
