"""Submit over HTTP → a worker process runs the job → the API serves the result, on SQLite and PostgreSQL;
and the best-config chain exact → nearest → default over configs published in the store."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.processes import ROOT, env, start_worker
from tests.fixtures.servers import SUBMIT, TOKENS, auth, publish, thread_server
from tests.fixtures.statements import sent_statements
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
JOB = {
    "template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "trials": 4, "sampler": "random",
    "seed": 3, "samples": 3, "finalists": 2, "comparators": False, "candidate_timeout_s": 60,
}


def _settings(url: str, **kw: object) -> ApiSettings:
    return ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False, **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_submit_run_by_a_worker_process_then_best_is_exact(db_url: str, tmp_path: Path) -> None:
    with thread_server(_settings(db_url)) as base, httpx.Client(base_url=base, timeout=30) as http:
        created = http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT))
        assert created.status_code == 201, created.text
        job = created.json()
        assert created.headers["location"] == f"/v1/jobs/{job['id']}"
        assert job["state"] == "queued" and job["backend"] == "triton" and job["progress"] == {
            "trials_done": 0, "trials_total": 4}
        assert job["submitted_by"].startswith("token:") and SUBMIT not in created.text

        worker = start_worker(db_url, "--exit-when-idle", "--heartbeat", "0.5", "--lease", "10",
                              log=tmp_path / "worker.log")
        assert worker.wait(timeout=300) == 0, (tmp_path / "worker.log").read_text()[-3000:]

        done = http.get(f"/v1/jobs/{job['id']}").json()
        (task,) = done["tasks"]
        assert done["state"] == "done" and done["progress"] == {"trials_done": 4, "trials_total": 4}
        assert task["state"] == "done" and task["best_config"]["mode"] == "ok" and task["best_us"] > 0
        assert http.get("/v1/jobs", params={"state": "done"}).json()["total"] == 1
        assert http.get("/v1/jobs", params={"state": "queued"}).json()["total"] == 0

        best = http.get("/v1/best", params={"template": NAME, "device": "cpu", "shape": "n=256"}).json()
        assert best["match"] == "exact" and best["distance"] == 0 and best["config"] == task["best_config"]
        assert best["median_us"] > 0 and best["n_samples"] == 3 and best["timer"] == "cpu-wall"
        assert best["measurement_id"] and best["fingerprint"] and best["source_shape"] == {"n": 256}

        history = http.get("/v1/history", params={"template": NAME, "device": "cpu", "n": 256}).json()
        assert history["study"]["id"] == task["study_id"] and history["total"] == len(history["items"]) >= 4
        assert all(m["reason"] for m in history["items"] if m["status"] not in ("OK", "INVALID"))
        page = http.get("/v1/history", params={"template": NAME, "device": "cpu", "n": 256, "limit": 2,
                                               "offset": 1, "role": "trial"}).json()
        assert [m["id"] for m in page["items"]] == [m["id"] for m in history["items"] if m["role"] == "trial"][1:3]

        (w,) = http.get("/v1/workers", params={"include_stopped": True}).json()
        assert w["state"] == "stopped" and w["device_kind"] == "cpu" and "triton" in w["backends"]
        assert http.get("/v1/workers").json() == []


def test_best_falls_back_from_exact_to_nearest_to_default(tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "t.db")
    store = db.Store.open(url)
    publish(store, NAME, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0)
    publish(store, NAME, {"n": 64}, {"mode": "ok", "BLOCK": 32}, 2.0)
    publish(store, NAME, {"n": 4096}, {"mode": "ok", "BLOCK": 16}, 5.0, version="0")  # an older template version
    with thread_server(_settings(url), store) as base, httpx.Client(base_url=base) as http:
        def best(**params: object) -> dict:  # type: ignore[type-arg]
            response = http.get("/v1/best", params={"template": NAME, "device": "cpu", **params})
            assert response.status_code == 200, response.text
            return response.json()  # type: ignore[no-any-return]

        exact = best(n=1024)
        assert exact["match"] == "exact" and exact["config"] == {"mode": "ok", "BLOCK": 512}
        assert exact["median_us"] == 10.0 and exact["device_name"] == "test-cpu"
        nearest = best(shape="n=2048")
        assert nearest["match"] == "nearest" and nearest["distance"] == 1.0 and nearest["source_shape"] == {"n": 1024}
        # n=400: n=1024 is nearer, but BLOCK=512 > 400 breaks the constraint: its config is repaired (the
        # nearest valid BLOCK, 256) rather than skipped for the farther n=64 one.
        checked = best(n=400)
        assert checked["match"] == "nearest" and checked["config"] == {"mode": "ok", "BLOCK": 256}
        assert checked["source_shape"] == {"n": 1024} and checked["median_us"] == 10.0
        assert checked["repaired"] == [{"param": "BLOCK", "entry": 512, "served": 256}]
        assert any("repaired" in note and "BLOCK 512 → 256" in note for note in checked["notes"])
        assert best(n=1024)["repaired"] == []
        # Only the current template version is served; nothing on cuda: the space's default.
        assert best(n=4096)["source_shape"] == {"n": 1024}
        default = best(n=1024, device="cuda")
        assert default["match"] == "default" and default["config"] == {"mode": "ok", "BLOCK": 64}
        assert default["median_us"] is None and default["measurement_id"] is None
        # Defaults of the template's dims complete the shape (n defaults to 1024).
        assert best()["shape"] == {"n": 1024} and best()["match"] == "exact"
        assert best(n=1024, device_name="other-cpu")["notes"] == [
            "nothing measured on 'other-cpu'; this config was measured on 'test-cpu'"]
        assert best(n=1024, fingerprint="0" * 12)["match"] == "default"


# The Mamba3 MIMO backward best tuned for R=4 on the H200 (benchmarks/h200/mamba3_mimo_bwd.db): invalid for R=16
# (C = 32 rows / 16 = 2 steps, fewer than 4; 64 rows need 4 warps).
MIMO = "mamba3_mimo_bwd"
MIMO_R4 = {"B": 4, "S": 2048, "H": 16, "G": 1, "N": 128, "P": 64, "R": 4, "rotary_divisor": 4, "dtype": "bfloat16"}
MIMO_R4_BEST = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
                "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4}
# What the current version (4) adds to a version-2 config it serves, and to a version-3 one.
V2_ADDED = {"state_pass": "scan", "qk_warps": "same"}
V3_ADDED = {"qk_warps": "same"}


def test_best_repairs_a_nearest_config_invalid_for_the_requested_shape(tmp_path: Path) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    publish(store, MIMO, MIMO_R4, MIMO_R4_BEST, 2023.7, device_kind="cuda", device_name="NVIDIA H200", version="2")
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        response = http.get("/v1/best", params={"template": MIMO, "device": "cuda", **MIMO_R4, "R": 16})
        assert response.status_code == 200, response.text
        r16 = response.json()
        assert r16["match"] == "nearest" and r16["source_shape"]["R"] == 4 and r16["median_us"] == 2023.7
        # a version-2 best, served by version 4 (it carries version 2) with the parameters versions 3 and 4 added
        assert r16["config"] == {**MIMO_R4_BEST, **V2_ADDED, "chunk_rows": 64, "num_warps": 4}
        assert r16["repaired"] == [{"param": "chunk_rows", "entry": 32, "served": 64},
                                  {"param": "num_warps", "entry": 2, "served": 4}]
        assert any("repaired" in note for note in r16["notes"])
        exact = http.get("/v1/best", params={"template": MIMO, "device": "cuda", **MIMO_R4}).json()
        assert exact["match"] == "exact" and exact["config"] == {**MIMO_R4_BEST, **V2_ADDED}
        assert exact["repaired"] == [] and any("template version 2" in note for note in exact["notes"])
        schema = http.get("/openapi.json").json()["components"]["schemas"]
        assert schema["BestOut"]["properties"]["repaired"]["items"] == {"$ref": "#/components/schemas/ConfigChangeOut"}


def test_best_serves_an_earlier_versions_best_until_the_current_version_has_its_own(tmp_path: Path) -> None:
    """MIMO version 4 carries versions 3 and 2 (tuner.spec.CarriedVersion): a shape tuned only under version 2
    is served its config (with the parameters versions 3 and 4 added), then version 3's once it has one (the
    first carried version with a best there), then version 4's own; a version-1 best (not carried) is never
    served. The export file and its client agree."""
    from tuner.service.client import ExportFile
    from tuner.service.export import build_export

    r2 = {**MIMO_R4, "R": 2}
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    h200 = {"device_kind": "cuda", "device_name": "NVIDIA H200"}
    publish(store, MIMO, MIMO_R4, MIMO_R4_BEST, 2023.7, version="2", **h200)
    publish(store, MIMO, r2, {**MIMO_R4_BEST, "num_warps": 4}, 1500.0, version="1", **h200)  # not carried
    v3 = {**MIMO_R4_BEST, "scan_block": 1024, "state_pass": "walk"}
    v4 = {**v3, "num_warps": 4, "qk_warps": "half"}

    def best(http: httpx.Client, shape: dict[str, Any]) -> dict[str, Any]:
        response = http.get("/v1/best", params={"template": MIMO, "device": "cuda", **shape})
        assert response.status_code == 200, response.text
        return response.json()

    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        carried = best(http, MIMO_R4)
        assert carried["match"] == "exact" and carried["median_us"] == 2023.7
        assert carried["config"] == {**MIMO_R4_BEST, **V2_ADDED}
        assert (carried["template_version"], carried["measured_version"]) == ("4", "2")
        assert any("template version 2" in note for note in carried["notes"])
        # R2 has only a version-1 best: version 4 does not carry it, so R2 gets R4's carried config (nearest)
        nearest = best(http, r2)
        assert nearest["match"] == "nearest" and nearest["source_shape"]["R"] == 4
        publish(store, MIMO, MIMO_R4, v3, 1800.0, version="3", **h200)
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        served = best(http, MIMO_R4)
        assert served["config"] == {**v3, **V3_ADDED} and served["median_us"] == 1800.0
        assert (served["template_version"], served["measured_version"]) == ("4", "3")
        publish(store, MIMO, MIMO_R4, v4, 1700.0, version="4", **h200)
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        own = best(http, MIMO_R4)
        assert own["match"] == "exact" and own["config"] == v4 and own["median_us"] == 1700.0
        assert not any("template version" in note for note in own["notes"]) and own["measured_version"] == "4"
    document = build_export(store, templates=[MIMO], device_kind="cuda")
    assert document["templates"][MIMO]["carries"] == ["3", "2"]
    assert [(e["template_version"], e["median_us"]) for e in document["entries"]] == [("4", 1700.0)]
    client = ExportFile(document)
    assert dict(client.answer(MIMO, MIMO_R4, "cuda", "NVIDIA H200").config) == v4


def test_this_versions_best_ranks_before_a_carried_one_and_a_carried_config_must_fit_the_space(
    tmp_path: Path,
) -> None:
    """Version 4 on the H200 and only version 2's on the H100 for one shape: a request that names no device
    (or a third one) is served version 4's, by the server and the export-file client alike; the H100 itself
    still gets its own device's (carried) entry. A carried config that is not a config of the current space
    (a parameter version 4 does not have) is not served."""
    from tuner.service.client import ExportFile
    from tuner.service.export import build_export

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    v4 = {**MIMO_R4_BEST, "scan_block": 1024, "state_pass": "walk", "qk_warps": "same"}
    publish(store, MIMO, MIMO_R4, v4, 3188.4, device_kind="cuda", device_name="NVIDIA H200", version="4")
    publish(store, MIMO, MIMO_R4, MIMO_R4_BEST, 4000.0, device_kind="cuda", device_name="NVIDIA H100", version="2")
    r2 = {**MIMO_R4, "R": 2}  # only a version-2 config with a parameter version 4 does not know
    publish(store, MIMO, r2, {**MIMO_R4_BEST, "gone": 1}, 2001.8, device_kind="cuda", device_name="NVIDIA H100",
            version="2")
    document = build_export(store, templates=[MIMO], device_kind="cuda")
    offline = ExportFile(document)
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        for name in (None, "NVIDIA B200", "NVIDIA H100"):
            params = {"template": MIMO, "device": "cuda", **MIMO_R4, **({"device_name": name} if name else {})}
            answer = http.get("/v1/best", params=params).json()
            want = "2" if name == "NVIDIA H100" else "4"
            assert answer["measured_version"] == want, (name, answer)
            assert offline.answer(MIMO, MIMO_R4, "cuda", name).entry.template_version == want  # type: ignore[union-attr]
        nearest = http.get("/v1/best", params={"template": MIMO, "device": "cuda", **r2}).json()
        assert nearest["source_shape"]["R"] == 4 and "gone" not in nearest["config"]
    assert all("gone" not in e["config"] for e in document["entries"])


def test_an_export_file_serves_a_carried_versions_entry(tmp_path: Path) -> None:
    from tuner.service.client import ExportFile
    from tuner.service.export import build_export

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    publish(store, MIMO, MIMO_R4, MIMO_R4_BEST, 2023.7, version="2", device_kind="cuda", device_name="NVIDIA H200")
    document = build_export(store, templates=[MIMO], device_kind="cuda")
    assert [(e["template_version"], e["config"]) for e in document["entries"]] == [
        ("2", {**MIMO_R4_BEST, **V2_ADDED})]
    answer = ExportFile(document).answer(MIMO, MIMO_R4, "cuda", "NVIDIA H200")
    assert answer.match == "exact" and dict(answer.config) == {**MIMO_R4_BEST, **V2_ADDED}
    # a file written before carried versions existed (no "carries") keeps to its own version's entries
    section = {k: v for k, v in document["templates"][MIMO].items() if k != "carries"}
    older = ExportFile({**document, "templates": {MIMO: section}})
    assert older.answer(MIMO, MIMO_R4, "cuda", "NVIDIA H200").match == "default"


def test_best_answers_are_cached_then_refreshed_in_the_background(tmp_path: Path) -> None:
    from tuner.api.main import create_app

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    settings = _settings(store.unmasked_url(), best_cache_ttl_s=0.5)
    app = create_app(settings, store)
    # The caches' clock, moved by the test: what is fresh, stale or gone never depends on how fast this machine
    # answers (real time only bounds the wait for the background refresh).
    now = [0.0]
    service = app.state.best
    service.answers.clock = service._entries.clock = lambda: now[0]
    with thread_server(settings, store, app=app) as base:
        query = {"template": NAME, "device": "cpu", "n": 512}

        def get() -> httpx.Response:
            return httpx.get(f"{base}/v1/best", params=query)

        first = get()
        assert first.json()["match"] == "default" and first.headers["x-cache"] == "miss"
        publish(store, NAME, {"n": 512}, {"mode": "ok", "BLOCK": 128}, 3.0)
        again = get()  # fresh for the TTL: the cached answer, although the store changed
        assert again.headers["x-cache"] == "hit" and again.content == first.content
        # A cached answer is no reason to skip the token check: an unknown token is refused, hit or not.
        forged = httpx.get(f"{base}/v1/best", params=query, headers={"Authorization": "Bearer " + "w" * 32})
        assert forged.status_code == 401 and "x-cache" not in forged.headers
        now[0] += 0.6
        stale = get()  # expired: still served at once, while a background refresh recomputes it
        assert stale.headers["x-cache"] == "hit" and stale.content == first.content
        deadline = time.monotonic() + 30
        while (fresh := get()).json()["match"] != "exact" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fresh.headers["x-cache"] == "hit" and fresh.json()["config"]["BLOCK"] == 128
        now[0] += 1.1  # unasked for twice the TTL: no longer served, recomputed on the request
        assert get().headers["x-cache"] == "miss"


def test_templates_are_described(tmp_path: Path) -> None:
    with thread_server(_settings(db.sqlite_url(tmp_path / "t.db"))) as base:
        one = httpx.get(f"{base}/v1/templates/{NAME}").json()
        assert one["backend"] == "triton" and one["default"] == {"mode": "ok", "BLOCK": 64}
        assert one["constraints"] == [{"expr": "BLOCK <= n", "reason": "a block larger than the vector"}]
        assert one["dims"][0]["name"] == "n" and one["dims"][0]["default"] == 1024
        assert {"name": "BLOCK", "kind": "pow2", "choices": [16, 32, 64, 128, 256, 512], "doc": ""} in one["parameters"]
        assert NAME in [t["name"] for t in httpx.get(f"{base}/v1/templates", timeout=120).json()]
        missing = httpx.get(f"{base}/v1/templates/nope")
        assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["path", "name"]
        assert "/v1/best" in httpx.get(f"{base}/openapi.json").json()["paths"]


def test_workers_whose_lease_expired_are_flagged_lost(tmp_path: Path) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with store.session() as session:
        for worker_id, lease_s in (("alive", 60.0), ("silent", 0.01)):
            db.register_worker(session, worker_id=worker_id, host="h", pid=1, device_kind="cuda",
                               device_name="NVIDIA H200", device_index=0, backends=["triton"], fingerprint_hash="f",
                               fingerprint_json="{}", lease_s=lease_s)
    time.sleep(0.05)
    with thread_server(_settings(store.unmasked_url()), store) as base:
        workers = {w["id"]: w for w in httpx.get(f"{base}/v1/workers").json()}
    assert workers["alive"]["state"] == "idle" and not workers["alive"]["lease_expired"]
    assert workers["silent"]["state"] == "lost" and workers["silent"]["lease_expired"]
    assert workers["silent"]["device_name"] == "NVIDIA H200" and workers["silent"]["backends"] == ["triton"]


def test_a_job_no_live_worker_can_take_says_why_it_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing is silent about a job that waits: the API says no live worker advertises its template and
    version, then (a worker advertising it having given its task up) who gave it up and why; /v1/workers
    shows what each worker advertises; ``tuner status`` prints the same."""
    from tuner.cli.app import _print_job

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        job = http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT)).json()
        version = job["template_version"]
        assert job["waiting"] == f"no live worker advertises {NAME} version {version}", job
        assert job["waiting_cause"] == "no_template", job
        assert job["max_attempts"] == 3 and job["tasks"][0]["attempts"] == 0
        store.register_worker(worker_id="w", host="h", pid=1, device_kind="cpu", device_name="CPU", device_index=0,
                              backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=60.0,
                              templates={NAME: version})
        unheld = http.get(f"/v1/jobs/{job['id']}").json()
        assert unheld["waiting"] is None and unheld["waiting_cause"] is None, unheld
        (worker,) = http.get("/v1/workers").json()
        assert worker["templates"] == {NAME: version}
        claim = store.claim_task(worker_id="w", device_kind="cpu", device_name="CPU", backends=["triton"])
        assert claim is not None
        store.fail_attempt(task_id=claim.task.id, worker_id="w", reason="DeviceError: gone")
        got = http.get(f"/v1/jobs/{job['id']}").json()
        listed = http.get("/v1/jobs").json()["items"][0]
    label = got["tasks"][0]["label"]
    assert got["state"] == "running" and got["error"] is None and listed["waiting"] == got["waiting"]
    assert got["waiting"] == f"every live worker gave {label} up: w: DeviceError: gone", got["waiting"]
    assert got["waiting_cause"] == "gave_up" and listed["waiting_cause"] == "gave_up", got
    (attempt,) = got["tasks"][0]["attempt_reasons"]
    assert got["tasks"][0]["attempts"] == 1 and (attempt["worker_id"], attempt["reason"]) == ("w", "DeviceError: gone")
    _print_job(got, as_json=False)
    printed = capsys.readouterr().out
    assert f"waiting: every live worker gave {label} up" in printed and "given up by w: DeviceError: gone" in printed
    store.close()


def test_jobs_are_listed_with_their_attempts_in_as_many_statements_for_8_jobs_as_for_2(db_url: str) -> None:
    """``GET /v1/jobs`` reads the attempts of every task on the page at once (it was one read per task with
    attempts: 2 + one per task), and the job page those of all its shapes at once; each listed task keeps its
    own attempts."""
    store = db.Store.open(db_url)
    store.register_worker(worker_id="w", host="h", pid=1, device_kind="cpu", device_name="CPU", device_index=0,
                          backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=600.0)

    def submit(jobs: int) -> list[int]:
        """``jobs`` jobs of 1 to 4 shapes, each shape given up by the worker (attempts 1 of 3: still open)."""
        ids = []
        for _ in range(jobs):
            shapes = 1 + len(store.list_jobs(limit=500)) % 4
            job = store.create_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                                   device_name=None, trials=4, sampler="random", samples=3, candidate_timeout_s=60,
                                   tasks=[(f"s{i}", f"n={i}", f'{{"n":{i}}}') for i in range(shapes)])
            while (claim := store.claim_task(worker_id="w", device_kind="cpu", device_name="CPU",
                                             backends=["triton"])) is not None:
                store.fail_attempt(task_id=claim.task.id, worker_id="w", reason=f"DeviceError: {claim.task.id}")
            ids.append(job.id)
        return ids

    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        def listed() -> tuple[int, list[dict[str, Any]]]:
            with sent_statements(store.engine) as statements:
                r = http.get("/v1/jobs", params={"limit": 500})
            assert r.status_code == 200, r.text[:300]
            return len(statements), r.json()["items"]

        def page(job_id: int) -> int:
            with sent_statements(store.engine) as statements:
                r = http.get(f"/ui/jobs/{job_id}")
            assert r.status_code == 200, r.text[:300]
            return len(statements)

        first = submit(2)
        few, _ = listed()
        more = submit(6)
        many, jobs = listed()
        one_shape, four_shapes = page(first[0]), page(more[1])
    assert len(jobs) == 8 and few == many, (few, many)
    assert one_shape == four_shapes and len(store.get_job(job_id=more[1]).tasks) == 4, (one_shape, four_shapes)
    for job in jobs:
        assert job["state"] in ("queued", "running") and job["tasks"], job
        for task in job["tasks"]:
            assert task["attempts"] == 1, task
            assert [(a["worker_id"], a["reason"]) for a in task["attempt_reasons"]] == [
                ("w", f"DeviceError: {task['id']}")], task
    store.close()


def test_status_and_jobs_say_a_verify_job_re_measures_in_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verify job has no trials: ``tuner status`` says verify, its shapes re-measured and in how many fresh
    processes, with a re-measured column (not '0/0 trials' and a 'best µs'); ``tuner jobs`` has a kind column.
    A verify job for a shape with no published best is refused (422): it could only fail on the worker."""
    from tuner.cli.app import _print_job

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
        tune = http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT)).json()
        body = {"template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "kind": "verify", "processes": 2}
        refused = http.post("/v1/jobs", json=body, headers=auth(SUBMIT))  # nothing published: nothing to verify
        assert refused.status_code == 422 and "no best config of" in refused.text, refused.text
        assert "n=256: nothing to verify; tune it first" in refused.text
        publish(store, NAME, {"n": 256}, {"mode": "ok", "BLOCK": 64}, 4.0)
        verify = http.post("/v1/jobs", json=body, headers=auth(SUBMIT)).json()
        assert verify["kind"] == "verify" and verify["progress"] == {"trials_done": 0, "trials_total": 0}
        listed = subprocess.run([sys.executable, "-m", "tuner.cli", "jobs", "--url", base], capture_output=True,
                                text=True, cwd=ROOT, timeout=120, env={**env(), "TUNER_HOME": str(tmp_path)})
    _print_job(verify, as_json=False)
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps at 80 columns here
    assert printed.startswith(f"job {verify['id']} queued: verify {NAME}@{verify['template_version']} on cpu, "
                              "0/1 shape(s) re-measured in 2 fresh processes each"), printed
    assert "trials" not in printed and "re-measured µs" in printed and "best µs" not in printed
    _print_job(tune, as_json=False)
    printed = " ".join(capsys.readouterr().out.split())
    assert printed.startswith(f"job {tune['id']} queued: {NAME}@{tune['template_version']} on cpu, 0/4 trials")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if line.split()[1:2] in (["1"], ["2"])}
    assert "verify" in rows[str(verify["id"])] and "2 processes" in rows[str(verify["id"])], listed.stdout
    assert "tune" in rows[str(tune["id"])] and "0/4" in rows[str(tune["id"])], listed.stdout
    store.close()


def test_the_servers_task_attempts_setting_is_stored_on_each_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K is the server's (TUNER_TASK_ATTEMPTS when the job is submitted), not each worker's."""
    from tuner.settings import engine_settings

    monkeypatch.setenv("TUNER_TASK_ATTEMPTS", "5")
    engine_settings.cache_clear()
    try:
        store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
        with thread_server(_settings(store.unmasked_url()), store) as base, httpx.Client(base_url=base) as http:
            job = http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT)).json()
        stored = store.get_job(job_id=job["id"])
        assert job["max_attempts"] == 5 and stored is not None and stored.max_attempts == 5
        store.close()
    finally:
        engine_settings.cache_clear()
