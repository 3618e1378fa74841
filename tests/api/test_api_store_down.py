"""The database goes away under a running server: 503 with a clear message, and the server keeps answering."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.fixtures import databases
from tests.fixtures.servers import SUBMIT, TOKENS, auth, publish, thread_server
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
JOB = {"template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "trials": 2}


@pytest.mark.postgres
def test_a_dropped_database_gives_503_and_the_server_keeps_answering(postgres_sandbox) -> None:  # type: ignore[no-untyped-def]
    # A database of its own (the sandbox's is shared by the session): created here, dropped under the server.
    admin = create_engine(databases.postgres_url(), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    name = f"tuner_down_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(databases.postgres_url()).set(database=name).render_as_string(hide_password=False)
    try:
        store = db.Store.open(url)
        publish(store, NAME, {"n": 256}, {"mode": "ok", "BLOCK": 64}, 4.0)
        settings = ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False, best_cache_ttl_s=60)  # type: ignore[arg-type]
        with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
            assert http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT)).status_code == 201
            cached = http.get("/v1/best", params={"template": NAME, "device": "cpu", "n": 256})
            assert cached.json()["match"] == "exact"

            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))

            for response in (
                http.get("/v1/jobs"),
                http.get("/v1/jobs/1"),
                http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT)),
                http.get("/v1/best", params={"template": NAME, "device": "cuda", "n": 256}),  # nothing cached
                http.get("/v1/workers"),
                http.get("/readyz"),
            ):
                assert response.status_code == 503, response.text
                detail = response.json()["detail"]
                assert detail.startswith("store unavailable: ") and name in detail, detail
            for page in (http.get("/"), http.get("/ui/jobs/1"), http.get(f"/ui/templates/{NAME}")):
                assert page.status_code == 503 and page.headers["retry-after"] == "5", page.text[:500]
                assert page.headers["content-type"].startswith("text/html") and "Store unavailable" in page.text
            # Still serving: health, templates, answers it had cached, and answers from the best configs of
            # (template, device kind) it had cached (a new shape of a known template needs no query).
            assert http.get("/healthz").status_code == 200
            assert http.get(f"/v1/templates/{NAME}").status_code == 200
            again = http.get("/v1/best", params={"template": NAME, "device": "cpu", "n": 256})
            assert again.status_code == 200 and again.content == cached.content
            nearest = http.get("/v1/best", params={"template": NAME, "device": "cpu", "n": 512})
            assert nearest.status_code == 200 and nearest.json()["match"] == "nearest"
        store.close()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
