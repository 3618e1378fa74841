"""The store's batched reads bind their ids in chunks (tuner.db._chunks.IN_CHUNK per IN list): PostgreSQL
refuses a statement binding more than 65 535 parameters. With the chunk made small, every such read answers
what it answers in one statement, in more statements; asked more ids than PostgreSQL binds, it answers. On
SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.fixtures.statements import selects, sent_statements
from tests.fixtures.studies import study_fields
from tuner import db
from tuner.db import _chunks
from tuner.store import NewMeasurement
from tuner.store.records import VERIFIED_LABEL, Status

MANY = 70_000  # more ids than PostgreSQL binds in one statement (65 535)


def _measure(store: db.Store, study_id: int, role: str, status: Status, us: float | None, **fields: Any) -> int:
    return int(store.record_measurement(NewMeasurement(
        study_id=study_id, role=role, candidate=fields.pop("candidate", "config"),
        config_json=fields.pop("config", {"BLOCK_H": 4}), status=status, median_us=us, **fields)).id)


def _verify(store: db.Store, study: db.StudyRecord, config: str, *, wrong: bool, device_name: str) -> None:
    status = (Status.WRONG_RESULT if wrong else Status.OK).value
    store.add_verification(
        study_id=study.id, config_json=config, stored_us=5.0, median_us=5.0, low_us=5.0, high_us=5.0, drift=0.0,
        tolerance=0.03, flagged=wrong, processes=1, figures=[{"process": 1, "candidates": [
            {"label": VERIFIED_LABEL, "status": status}]}],
        device_kind="cuda", device_name=device_name, fingerprint_hash="f", fingerprint_json="{}")


def _fill(store: db.Store) -> tuple[list[int], list[int], list[int]]:
    """Five studies with trials, final rounds, bests and verifications, and three jobs whose tasks workers
    hold or gave up: (study ids, final measurement ids, task ids)."""
    studies = [store.get_or_create_study(**study_fields(S=1024 * (n + 1))) for n in range(5)]
    finals = []
    for n, study in enumerate(studies):
        for t, status in enumerate([Status.OK, Status.RUNTIME_ERROR, Status.INVALID][: n % 3 + 1]):
            _measure(store, study.id, "trial", status, 5.0 if status == Status.OK else None, trial_number=t)
        for round_id in ("r1", "r2")[: n % 2 + 1]:
            best = _measure(store, study.id, "final", Status.OK, 2.0 + n, round_id=round_id)
            finals += [best, _measure(store, study.id, "final", Status.OK, 3.0 + n, round_id=round_id,
                                      candidate="default")]
            finals.append(_measure(store, study.id, "final", Status.WRONG_RESULT, None, round_id=round_id,
                                   config={"BLOCK_H": 8 + n}))
        if n % 2 == 0:
            store.publish_best(study_id=study.id, measurement_id=best)
        _verify(store, study, '{"BLOCK_H": 2}', wrong=n != 1, device_name=study.device_name)
        _verify(store, study, '{"BLOCK_H": 16}', wrong=True, device_name="NVIDIA A100" if n % 2 else study.device_name)
    tasks = []
    for _ in range(3):
        job = store.create_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                               device_name=None, trials=2, sampler="tpe", samples=10, candidate_timeout_s=60.0,
                               tasks=[(f"w{i}", f"n={i}", f'{{"n": {i}}}') for i in range(2)])
        tasks += [t.id for t in job.tasks]
    for worker in ("a", "b", "c"):
        store.register_worker(worker_id=worker, host="h", pid=1, device_kind="cpu", device_name="CPU",
                              device_index=0, backends=["triton"], fingerprint_hash="f", fingerprint_json="{}",
                              lease_s=30.0)
        claim = store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"])
        assert claim is not None
        if worker == "b":
            store.fail_attempt(task_id=claim.task.id, worker_id=worker, reason="gave up")
    return [s.id for s in studies], finals, tasks


def _reads(store: db.Store, studies: list[int], finals: list[int], tasks: list[int]) -> dict[str, Callable[[], Any]]:
    """The reads that bind one parameter per id, asked for the ids (with an unknown one and a repeat)."""
    study_ids = [*studies, 999_999, studies[0]]
    return {
        "latest_verifications": lambda: store.latest_verifications(study_ids=study_ids),
        "disproved_configs": lambda: store.disproved_configs(study_ids=study_ids),
        "study_outcomes": lambda: store.study_outcomes(study_ids=study_ids),
        "round_defaults": lambda: store.round_defaults(measurement_ids=[*finals, 999_999, finals[0]]),
        "study_summaries": lambda: store.list_study_summaries(),
        "jobs": lambda: store.list_jobs(limit=500),
        "attempts_by_task": lambda: store.attempts_by_task(task_ids=[*tasks, 999_999]),
    }


def test_chunked_reads_answer_what_one_statement_answers(store: db.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    studies, finals, tasks = _fill(store)
    reads = _reads(store, studies, finals, tasks)
    whole, sent = {}, {}
    for name, read in reads.items():
        with sent_statements(store.engine) as statements:
            whole[name] = read()
        sent[name] = len(selects(statements))
    assert whole["latest_verifications"] and whole["disproved_configs"] and whole["round_defaults"]
    assert any(job.workers for job in whole["jobs"]) and whole["attempts_by_task"]
    monkeypatch.setattr(_chunks, "IN_CHUNK", 2)
    for name, read in reads.items():
        with sent_statements(store.engine) as statements:
            assert read() == whole[name], name
        assert len(selects(statements)) > sent[name], f"{name} sent no more statements with chunks of 2"


def test_reads_take_more_ids_than_a_statement_binds(store: db.Store) -> None:
    studies, finals, tasks = _fill(store)
    unknown = list(range(10_000_000, 10_000_000 + MANY))
    for name, read in _reads(store, [*unknown, *studies], [*unknown, *finals], [*unknown, *tasks]).items():
        if name not in ("study_summaries", "jobs"):  # those read ids the store holds, not ids asked for
            assert read() == _reads(store, studies, finals, tasks)[name](), name
