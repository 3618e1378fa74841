"""``GET /v1/best`` answered from a config verified on another device name or software queues one verify job
on the requester's device (SQLite and PostgreSQL, a real server)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager

import httpx
import pytest
from pydantic import ValidationError

from tests.fixtures.processes import wait_for
from tests.fixtures.servers import TOKENS, publish, thread_server
from tuner import db
from tuner.api.reverify import SUBMITTER
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"


@pytest.fixture
def store(db_url: str) -> Iterator[db.Store]:
    with db.Store.open(db_url) as store:
        publish(store, NAME, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0, libraries={"triton": "3.4.0"})
        yield store


def _jobs(store: db.Store) -> list[db.JobRecord]:
    with store.session() as session:
        return db.list_jobs(session)


def _worker(store: db.Store, device_name: str, templates: dict[str, str] | None = None) -> None:
    """A live worker of that CPU device name (a re-verification is queued only where one could run it)."""
    store.register_worker(worker_id=f"w-{device_name}", host="h", pid=1, device_kind="cpu",  # type: ignore[arg-type]
                          device_name=device_name, device_index=0, backends=["triton"], fingerprint_hash="f",
                          fingerprint_json="{}", lease_s=600.0, templates=templates)


def _serve(store: db.Store, **settings: object) -> AbstractContextManager[str]:
    values: dict[str, object] = {"db_url": store.unmasked_url(), "tokens": TOKENS, "warm_templates": False,
                                 "best_cache_ttl_s": 0, **settings}
    return thread_server(ApiSettings(**values), store)  # type: ignore[arg-type]


def test_a_foreign_answer_queues_one_verify_job_on_the_requesters_device(store: db.Store) -> None:
    _worker(store, "other-cpu")
    _worker(store, "third-cpu", templates={NAME: "1"})
    _worker(store, "old-cpu", templates={NAME: "0"})  # another version of the template: cannot verify this one
    with _serve(store) as base, httpx.Client(base_url=base) as http:
        def best(**params: object) -> dict:  # type: ignore[type-arg]
            response = http.get("/v1/best", params={"template": NAME, "device": "cpu", "n": 1024, **params})
            assert response.status_code == 200, response.text
            return response.json()  # type: ignore[no-any-return]

        assert best()["match"] == "exact"  # nothing compared: nothing to re-verify
        assert best(device_name="test-cpu", software="triton=3.4.0")["match"] == "exact"
        time.sleep(0.5)
        assert _jobs(store) == []
        assert best(n=2048)["match"] == "nearest"  # another shape only: a tuning matter, not a verification
        time.sleep(0.5)
        assert _jobs(store) == []

        foreign = best(device_name="other-cpu", software="triton=3.5.0")
        assert foreign["match"] == "nearest" and {d["what"] for d in foreign["differences"]} == {"device_name",
                                                                                                "triton"}
        wait_for(lambda: len(_jobs(store)) == 1, 30, "the verify job")
        (job,) = _jobs(store)
        assert (job.kind, job.template, job.device_kind, job.device_name) == ("verify", NAME, "cpu", "other-cpu")
        assert job.state == "queued" and job.submitted_by == SUBMITTER and job.processes == 5
        assert [t.shape for t in job.tasks] == [{"n": 1024}]
        # Asked again (and with other software, or a neighbouring shape served by the same entry): the job is
        # already queued, none is added.
        best(device_name="other-cpu", software="triton=3.5.0")
        best(device_name="other-cpu", software="triton=3.6.0")
        best(n=2048, device_name="other-cpu")
        time.sleep(1.0)
        assert len(_jobs(store)) == 1
        # A device name no live worker serves (or none with this version of the template) queues nothing:
        # a reader's requests alone cannot fill the queue with jobs nobody can run.
        for name in ("nobody-cpu", "old-cpu", *(f"made-up-{i}" for i in range(20))):
            assert best(device_name=name)["match"] == "nearest"
        time.sleep(1.0)
        assert len(_jobs(store)) == 1
        # Another device name that a live worker serves is another job.
        best(device_name="third-cpu")
        wait_for(lambda: len(_jobs(store)) == 2, 30, "the second verify job")


def test_a_request_no_worker_could_serve_is_asked_again_once_one_starts(store: db.Store,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A foreign answer for a device no live worker served queued nothing, and the server remembered the
    request as handled for good: a worker of that device started later never got the re-verification. Now
    such a request counts as handled for RETRY_S only (a minute; here half a second)."""
    from tuner.api import reverify

    monkeypatch.setattr(reverify, "RETRY_S", 0.5)
    params = {"template": NAME, "device": "cpu", "n": 1024, "device_name": "late-cpu"}
    with _serve(store) as base, httpx.Client(base_url=base) as http:
        assert http.get("/v1/best", params=params).json()["match"] == "nearest"
        time.sleep(1.0)
        assert _jobs(store) == []  # no worker of late-cpu yet
        _worker(store, "late-cpu")
        assert http.get("/v1/best", params=params).json()["match"] == "nearest"
        wait_for(lambda: len(_jobs(store)) == 1, 30, "the verify job once a worker serves the device")
        (job,) = _jobs(store)
        assert (job.kind, job.device_name) == ("verify", "late-cpu")


def test_re_verification_can_be_turned_off(store: db.Store) -> None:
    with _serve(store, reverify_foreign=False) as base:
        answer = httpx.get(f"{base}/v1/best", params={"template": NAME, "device": "cpu", "device_name": "other"})
        assert answer.json()["match"] == "nearest"
        time.sleep(0.5)
        assert _jobs(store) == []


def test_re_verification_jobs_can_limit_the_comparators_to_the_first_processes(store: db.Store) -> None:
    """TUNER_REVERIFY_COMPARATOR_PROCESSES reaches the queued job; above TUNER_REVERIFY_PROCESSES it is refused
    when the settings are read."""
    _worker(store, "other-cpu")
    with _serve(store, reverify_processes=3, reverify_comparator_processes=1) as base:
        answer = httpx.get(f"{base}/v1/best", params={"template": NAME, "device": "cpu", "n": 1024,
                                                       "device_name": "other-cpu"})
        assert answer.json()["match"] == "nearest"
        wait_for(lambda: len(_jobs(store)) == 1, 30, "the verify job")
    (job,) = _jobs(store)
    assert (job.kind, job.processes, job.comparator_processes) == ("verify", 3, 1)
    with pytest.raises(ValidationError, match=r"reverify_comparator_processes\n.*must be at most "
                       r"TUNER_REVERIFY_PROCESSES \(3\), got 4"):
        ApiSettings(reverify_processes=3, reverify_comparator_processes=4)  # type: ignore[call-arg]
    # set but empty (an env file's way to unset it): every process
    assert ApiSettings(reverify_comparator_processes="").reverify_comparator_processes is None  # type: ignore[call-arg,arg-type]


def test_a_carried_versions_answer_queues_no_verify_job(store: db.Store) -> None:
    """A best of a version the current one carries (tuner.spec.CarriedVersion: MIMO version 4 serves version 2's)
    answered to another device name is foreign, but there is no current-version best to re-verify: a verify job
    would fail ("no best config of mamba3_mimo_bwd@4 is published"). Tuning the shape replaces the entry."""
    mimo = "mamba3_mimo_bwd"
    shape = {"B": 4, "S": 2048, "H": 16, "G": 1, "N": 128, "P": 64, "R": 4, "rotary_divisor": 4, "dtype": "bfloat16"}
    config = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
              "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4}
    publish(store, mimo, shape, config, 3681.6, device_kind="cuda", device_name="NVIDIA H200", version="2")
    store.register_worker(worker_id="w-h100", host="h", pid=1, device_kind="cuda", device_name="NVIDIA H100",
                          device_index=0, backends=["triton"], fingerprint_hash="f", fingerprint_json="{}",
                          lease_s=600.0, templates={mimo: "4"})
    with _serve(store) as base, httpx.Client(base_url=base) as http:
        answer = http.get("/v1/best", params={"template": mimo, "device": "cuda", "device_name": "NVIDIA H100",
                                              **shape}).json()
        assert answer["match"] == "nearest" and answer["config"] == {**config, "state_pass": "scan", "qk_warps": "same"}
        assert {d["what"] for d in answer["differences"]} == {"device_name"}
        time.sleep(1.0)  # the server queues verify jobs from a thread of its own
        assert _jobs(store) == []
        # control: a version-4 best answered to the H100 is foreign and has a current-version best to verify
        r2 = {**shape, "R": 2}
        publish(store, mimo, r2, {**config, "state_pass": "walk", "qk_warps": "same"}, 2001.8, device_kind="cuda",
                device_name="NVIDIA H200", version="4")
        own = http.get("/v1/best", params={"template": mimo, "device": "cuda", "device_name": "NVIDIA H100",
                                           **r2}).json()
        assert own["measured_version"] == "4" and own["match"] == "nearest"
        wait_for(lambda: len(_jobs(store)) == 1, 30, "the control's verify job")
        assert [t.shape["R"] for t in _jobs(store)[0].tasks] == [2]
