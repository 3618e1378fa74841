"""Bad input gets a 4xx with field-level messages and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.servers import SUBMIT, TOKENS, auth, thread_server
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
GOOD: dict[str, Any] = {"template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "trials": 2}


@pytest.fixture(scope="module")
def server(sqlite_server: tuple[str, db.Store]) -> tuple[str, db.Store]:
    return sqlite_server


def _jobs(store: db.Store) -> int:
    with store.session() as session:
        return db.count_jobs(session)


def _with(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


@pytest.mark.parametrize(
    ("body", "status", "loc", "message"),
    [
        (_with(template="nope"), 404, ["body", "template"], "unknown template 'nope'"),
        (_with(shapes=[{"n": "many"}]), 422, ["body", "shapes", 0], "shape dim n: expected an integer"),
        (_with(shapes=[{"n": 256}, {"m": 3}]), 422, ["body", "shapes", 1], "unknown shape dim(s) m"),
        (_with(shapes=[{"n": 0}]), 422, ["body", "shapes", 0], "must be >= 1"),
        (_with(shapes=[], workloads=["huge"]), 422, ["body", "workloads", 0], "unknown workload 'huge'"),
        (_with(shapes=[]), 422, ["body", "shapes"], "give at least one workload or shape"),
        (_with(shapes=[{"n": [1, 2]}]), 422, ["body", "shapes", 0, "n", "int"], "valid integer"),
        (_with(trials=0), 422, ["body", "trials"], "greater than or equal to 1"),
        (_with(trials=-5), 422, ["body", "trials"], "greater than or equal to 1"),
        (_with(trials=10**9), 422, ["body", "trials"], "less than or equal to 100000"),
        (_with(samples=0), 422, ["body", "samples"], "greater than or equal to 1"),
        (_with(candidate_timeout_s=0.1), 422, ["body", "candidate_timeout_s"], "greater than or equal to 1"),
        (_with(seed=-1), 422, ["body", "seed"], "greater than or equal to 0"),
        (_with(sampler="anneal"), 422, ["body", "sampler"], "'tpe', 'random', 'grid' or 'cmaes'"),
        (_with(device={"kind": "tpu"}), 422, ["body", "device", "kind"], "'cuda', 'npu' or 'cpu'"),
        (_with(device={"kind": "cuda", "name": ""}), 422, ["body", "device", "name"], "at least 1 character"),
        (_with(device="tpu"), 422, ["body", "device", "kind"], "'cuda', 'npu' or 'cpu'"),  # the kind alone
        (_with(device=7), 422, ["body", "device"], "valid dictionary"),
        (_with(fixed={"BLOCK": 64}), 422, ["body", "fixed"], "Extra inputs are not permitted"),
        ({k: v for k, v in GOOD.items() if k != "device"}, 422, ["body", "device"], "Field required"),
        (_with(shapes=[{"n": i} for i in range(1, 300)]), 422, ["body", "shapes"], "at most 256 items"),
    ],
)
def test_a_bad_job_is_refused_with_a_located_message(
    server: tuple[str, db.Store], body: dict[str, Any], status: int, loc: list[Any], message: str
) -> None:
    base, store = server
    before = _jobs(store)
    response = httpx.post(f"{base}/v1/jobs", json=body, headers=auth(SUBMIT))
    assert response.status_code == status, response.text
    errors = response.json()["detail"]
    assert any(e["loc"] == loc and message in e["msg"] for e in errors), errors
    assert _jobs(store) == before


def test_the_device_may_be_its_kind_alone_as_get_best_takes_it(server: tuple[str, db.Store]) -> None:
    base, store = server
    response = httpx.post(f"{base}/v1/jobs", json=_with(device="cpu"), headers=auth(SUBMIT))
    assert response.status_code == 201, response.text
    assert response.json()["device"] == {"kind": "cpu", "name": None}
    job = store.get_job(job_id=response.json()["id"])
    assert job is not None and (job.device_kind, job.device_name) == ("cpu", None)
    assert httpx.post(f"{base}/v1/jobs/{job.id}/cancel", headers=auth(SUBMIT)).status_code == 200


def test_malformed_json_oversized_and_chunked_bodies(server: tuple[str, db.Store]) -> None:
    base, store = server
    before = _jobs(store)
    headers = {**auth(SUBMIT), "content-type": "application/json"}
    malformed = httpx.post(f"{base}/v1/jobs", content=b'{"template": ', headers=headers)
    assert malformed.status_code == 422 and malformed.json()["detail"][0]["type"] == "json_invalid"
    not_an_object = httpx.post(f"{base}/v1/jobs", content=b"[1, 2]", headers=headers)
    assert not_an_object.status_code == 422
    padded = {**GOOD, "workloads": ["x" * 1000] * 70}
    oversized = httpx.post(f"{base}/v1/jobs", json=padded, headers=auth(SUBMIT))
    assert oversized.status_code == 413 and "larger than 65536 bytes" in oversized.text

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b" " * 1000

    chunked = httpx.post(f"{base}/v1/jobs", content=chunks(), headers=headers)
    assert chunked.status_code == 413
    assert _jobs(store) == before
    assert httpx.post(f"{base}/v1/jobs", json=GOOD, headers=auth(SUBMIT)).status_code == 201, "still serving"


@pytest.mark.parametrize(
    ("params", "status", "loc"),
    [
        ({"template": "nope", "device": "cpu", "n": 1}, 404, ["query", "template"]),
        ({"template": NAME, "device": "cpu", "n": "x"}, 422, ["query", "shape"]),
        ({"template": NAME, "device": "cpu", "shape": "n=1,n=2"}, 422, ["query", "shape"]),
        ({"template": NAME, "device": "cpu", "shape": "n=1", "n": 2}, 422, ["query", "n"]),
        ({"template": NAME, "device": "cpu", "m": 2}, 422, ["query", "shape"]),
        ({"template": NAME, "device": "tpu", "n": 2}, 422, ["query", "device"]),
        ({"template": NAME, "n": 2}, 422, ["query", "device"]),
    ],
)
def test_a_bad_best_query_is_refused(server: tuple[str, db.Store], params: dict[str, Any], status: int,
                                     loc: list[str]) -> None:
    response = httpx.get(f"{server[0]}/v1/best", params=params)
    assert response.status_code == status, response.text
    assert response.json()["detail"][0]["loc"] == loc


def test_unknown_job_and_bad_paging(server: tuple[str, db.Store]) -> None:
    base, _ = server
    assert httpx.get(f"{base}/v1/jobs/12345").status_code == 404
    assert httpx.get(f"{base}/v1/jobs/abc").status_code == 422
    assert httpx.get(f"{base}/v1/jobs", params={"limit": 0}).status_code == 422
    assert httpx.get(f"{base}/v1/jobs", params={"state": "sleeping"}).status_code == 422
    no_study = httpx.get(f"{base}/v1/history", params={"template": NAME, "device": "cpu", "n": 7})
    assert no_study.status_code == 404 and "no study" in no_study.text


def test_the_store_path_is_not_a_file(tmp_path: Path) -> None:
    """An unusable store: the server starts, answers what needs no store, and 503 (not 500) for the rest."""
    url = db.sqlite_url(tmp_path / "missing-dir" / "t.db")
    settings = ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings) as base, httpx.Client(base_url=base) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get(f"/v1/templates/{NAME}").status_code == 200
        for response in (http.get("/v1/jobs"), http.post("/v1/jobs", json=GOOD, headers=auth(SUBMIT)),
                         http.get("/v1/best", params={"template": NAME, "device": "cpu"}), http.get("/readyz")):
            assert response.status_code == 503, response.text
            assert response.json()["detail"].startswith("store unavailable: cannot open store sqlite:///")
            assert response.headers["retry-after"] == "5"
        # The directory appears: the next request opens the store, nothing restarted.
        (tmp_path / "missing-dir").mkdir()
        assert http.get("/v1/jobs").status_code == 200
        assert http.get("/readyz").json()["status"] == "ok"


def test_a_template_that_does_not_load_is_left_out_of_the_list(server: tuple[str, db.Store]) -> None:
    from tests.fixtures.fault_templates import REF
    from tuner import registry

    base, _ = server
    registry.register("fault_vector_scale", REF)  # a test template without a search-space file
    try:
        listing = httpx.get(f"{base}/v1/templates", timeout=120)
        assert listing.status_code == 200, listing.text
        names = [t["name"] for t in listing.json()]
        assert NAME in names and "mamba2_chunk_cumsum" in names and "fault_vector_scale" not in names
        alone = httpx.get(f"{base}/v1/templates/fault_vector_scale", timeout=120)
        assert alone.status_code == 422 and "search_space_error" in alone.text
        assert "fault_vector_scale.yaml" in alone.text
    finally:
        registry.unregister("fault_vector_scale")
    assert "fault_vector_scale" not in registry.names()
