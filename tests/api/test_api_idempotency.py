"""``POST /v1/jobs`` under an ``Idempotency-Key``: a repeat finds the job it created, another request under the
key is refused, and ``tuner submit`` (:func:`tuner.service.remote.call`) sends a request whose answer was lost
again and gets its job, not a second one. A real server, a real store, a real TCP connection dropped."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fixtures.faults import TcpProxy
from tests.fixtures.servers import SUBMIT, auth, publish
from tuner import db

NAME = "fault_vector_scale_tunable"
BODY: dict[str, Any] = {"template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "trials": 2}


@pytest.fixture(scope="module")
def server(sqlite_server: tuple[str, db.Store]) -> tuple[str, db.Store]:
    return sqlite_server


def _post(base: str, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = {**auth(SUBMIT), **({"Idempotency-Key": key} if key is not None else {})}
    return httpx.post(f"{base}/v1/jobs", json=body, headers=headers, timeout=30)


def test_a_repeat_under_its_key_gets_its_job_and_another_request_is_refused(server: tuple[str, db.Store]) -> None:
    base, store = server
    before = store.count_jobs()
    first = _post(base, BODY, "k-repeat")
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = _post(base, {**BODY, "trials": 2, "sampler": "tpe"}, "k-repeat")  # the defaults spelled out: the same
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true", again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]
    other = _post(base, {**BODY, "trials": 3}, "k-repeat")
    assert other.status_code == 409 and "was used for another request" in other.json()["detail"]
    assert _post(base, BODY, None).json()["id"] != first.json()["id"]  # no key: a new job each time
    verify = {**BODY, "kind": "verify", "processes": 2}
    verify.pop("trials")
    publish(store, NAME, {"n": 256}, {"mode": "ok", "BLOCK": 64}, 4.0)  # a verify job needs a published best
    v1, v2 = _post(base, verify, "k-verify"), _post(base, verify, "k-verify")
    assert (v1.status_code, v2.status_code) == (201, 200) and v1.json()["id"] == v2.json()["id"]
    assert store.count_jobs() == before + 3


def test_concurrent_repeats_under_one_key_get_one_201_and_replays(server: tuple[str, db.Store]) -> None:
    """Four identical requests under one key at once (a client's retries racing): one creates the job (201),
    each other one is told it is a replay (200, Idempotent-Replayed), every answer names the same job. Before,
    a repeat that raced the creation got 201 without the header."""
    from concurrent.futures import ThreadPoolExecutor

    base, store = server
    before = store.count_jobs()
    for round_ in range(3):
        key = f"k-race-{round_}"
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _, key=key: _post(base, BODY, key), range(4)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 200, 200, 201], [a.text for a in answers]
        assert {a.json()["id"] for a in answers} == {store.job_with_key(idempotency_key=key).id}
        assert all(a.headers.get("idempotent-replayed") == "true" for a in answers if a.status_code == 200)
    assert store.count_jobs() == before + 3


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "é".encode("latin-1")])
def test_a_malformed_key_is_422(server: tuple[str, db.Store], key: str | bytes) -> None:
    base, store = server
    before = store.count_jobs()
    response = httpx.post(f"{base}/v1/jobs", json=BODY, headers={**auth(SUBMIT), "Idempotency-Key": key}, timeout=30)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert store.count_jobs() == before


def test_tuner_submit_sends_a_request_whose_answer_was_lost_again_and_gets_one_job(
    server: tuple[str, db.Store],
) -> None:
    from tuner.service.remote import call

    base, store = server
    proxy = TcpProxy("127.0.0.1", int(base.rsplit(":", 1)[1]))
    proxy.lose_next_answers(1)  # the server creates the job; its answer is lost with the connection
    before = store.count_jobs()
    try:
        job = call("POST", "/v1/jobs", url=f"http://127.0.0.1:{proxy.port}", token=SUBMIT, json=BODY,
                   idempotency_key="k-lost-answer")
    finally:
        proxy.close()
    assert proxy.answers_lost == 1 and proxy.connections == 2  # one retry, on a new connection
    assert store.count_jobs() == before + 1 and store.job_with_key(idempotency_key="k-lost-answer").id == job["id"]
