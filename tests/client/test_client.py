"""The runtime client against a real server and a real export file (written by `tuner export`)."""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.fault_templates import _scale
from tests.fixtures.processes import ROOT, env, wait_for
from tests.fixtures.servers import READ, SUBMIT, TOKENS, export, free_port, publish, thread_server
from tuner import db
from tuner.api.settings import ApiSettings
from tuner.lookup import ConfigChange
from tuner.service.client import (
    BestConfig,
    Client,
    ClientError,
    ExportFile,
    server_base,
    split_launch_config,
    triton_launch_kwargs,
)

NAME = "fault_vector_scale_tunable"
SHAPES = [{"n": 1024}, {"n": 2048}, {"n": 400}, {}, {"n": 64}]


class FakeClock:
    """An injectable monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[db.Store]:
    with db.Store.open(db.sqlite_url(tmp_path / "t.db")) as store:
        publish(store, NAME, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0)
        publish(store, NAME, {"n": 64}, {"mode": "ok", "BLOCK": 32}, 2.0)
        yield store


def test_answers_are_cached_until_the_ttl_expires(store: db.Store, server: str) -> None:
    clock = FakeClock()
    client = Client(server, ttl_s=60, clock=clock)
    first = client.best(NAME, {"n": 512}, device="cpu")
    assert (first.match, first.source, dict(first.config)) == ("nearest", "server", {"mode": "ok", "BLOCK": 512})
    publish(store, NAME, {"n": 512}, {"mode": "ok", "BLOCK": 128}, 3.0)
    clock.now += 59
    assert client.best(NAME, {"n": 512}, device="cpu") is first
    # Everything in the request is in the key: another device or device name is another answer.
    assert client.best(NAME, {"n": 512}, device="cuda").match == "default"
    assert client.best(NAME, {"n": 512}, device="cpu", device_name="test-cpu").match == "exact"
    clock.now += 2
    fresh = client.best(NAME, {"n": 512}, device="cpu")
    assert fresh.match == "exact" and fresh.config["BLOCK"] == 128 and fresh.median_us == 3.0
    assert fresh.measurement_id is not None and fresh.fingerprint and fresh.timer == "cpu-wall"
    client.invalidate()
    assert client.best(NAME, {"n": 512}, device="cpu") is not fresh
    with pytest.raises(TypeError):
        fresh.config["BLOCK"] = 1  # type: ignore[index]


def test_refusals_raise_and_outages_fall_back_to_the_file_then_the_callers_config(
    store: db.Store, server: str, tmp_path: Path
) -> None:
    online = Client(server)
    with pytest.raises(ClientError) as unknown:
        online.best("nope", {"n": 1}, device="cpu")
    assert unknown.value.status == 404 and "unknown template 'nope'" in str(unknown.value)
    with pytest.raises(ClientError) as bad:
        online.best(NAME, {"m": 1}, device="cpu")
    assert bad.value.status == 422 and "unknown shape dim(s) m" in str(bad.value)

    path = _export(store, tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    clock = FakeClock()
    with_file = Client(down, file=path, clock=clock, retry_s=5, timeout_s=0.5)
    answer = with_file.best(NAME, {"n": 1024}, device="cpu")
    assert answer.source == "file" and answer.match == "exact" and answer.config["BLOCK"] == 512
    assert with_file.best(NAME, {"n": 2048}, device="cpu").source == "file"  # resting: the server is not asked

    bare = Client(down, clock=clock, retry_s=5, timeout_s=0.5)
    with pytest.raises(ClientError, match="server is unavailable and there is no export file"):
        bare.best(NAME, {"n": 1024}, device="cpu")
    fallback = bare.best(NAME, {"n": 1024}, device="cpu", fallback={"mode": "ok", "BLOCK": 16})
    assert fallback.source == "fallback" and fallback.match == "default" and fallback.config["BLOCK"] == 16
    clock.now += 4
    assert bare.best(NAME, {"n": 1024}, device="cpu") is fallback  # cached for retry_s only
    clock.now += 2
    with pytest.raises(ClientError):
        bare.best(NAME, {"n": 1024}, device="cpu")


def test_the_export_file_answers_offline_as_the_server_does(store: db.Store, server: str, tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        path = _export(store, tmp_path)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as open() writes it: runtime clients of other users read it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    document = json.loads(path.read_text())
    assert document["format"] == "tuner-best-configs" and document["schema_version"] == 1
    assert document["generated_at"].endswith("Z") and len(document["entries"]) == 2
    section = document["templates"][NAME]
    assert section["default"] == {"BLOCK": 64, "mode": "ok"}
    assert section["constraints"] == [{"expr": "BLOCK <= n", "reason": "a block larger than the vector"}]

    online, offline = Client(server), Client.from_file(path)
    for shape in SHAPES:
        for device in ("cpu", "cuda"):
            a, b = online.best(NAME, shape, device=device), offline.best(NAME, shape, device=device)
            assert (a.match, dict(a.config), a.median_us, a.measurement_id, dict(a.shape), a.repaired) == (
                b.match, dict(b.config), b.median_us, b.measurement_id, dict(b.shape), b.repaired), (shape, device)
            assert (a.source, b.source) == ("server", "file")
    # n=400: the n=1024 config (BLOCK 512) breaks BLOCK <= n offline too: repaired to BLOCK 256 as online.
    checked = offline.best(NAME, {"n": 400}, device="cpu")
    assert checked.match == "nearest" and checked.config["BLOCK"] == 256 and checked.notes
    assert checked.repaired == (ConfigChange("BLOCK", 512, 256),) and checked.source_shape == {"n": 1024}
    assert {"name": "BLOCK", "kind": "pow2", "choices": [16, 32, 64, 128, 256, 512]} in section["domains"]
    # A file written before domains were exported repairs nothing: the entry is skipped, as before repairs.
    older = ExportFile({**document, "templates": {NAME: {k: v for k, v in section.items() if k != "domains"}}})
    assert dict(Client(file=older).best(NAME, {"n": 400}, device="cpu").config) == {"mode": "ok", "BLOCK": 32}
    assert offline.best(NAME, {}, device="cpu").shape == {"n": 1024}  # dim defaults from the file
    with pytest.raises(ClientError, match="unknown shape dim"):
        offline.best(NAME, {"m": 3}, device="cpu")
    with pytest.raises(ClientError, match="not in"):
        offline.best("nope", {"n": 3}, device="cpu")
    assert offline.best("nope", {"n": 3}, device="cpu", fallback={"BLOCK": 8}).source == "fallback"
    assert offline.best(NAME, {"n": 1024}).device_kind == "cpu"  # auto: torch (imported here) has no GPU
    with pytest.raises(ClientError, match="schema version 1"):
        ExportFile({**document, "schema_version": 99})
    missing = tmp_path / "never-written.json"  # the README's `file="best.json"` before `tuner export` ran
    said = f"no export file {missing}: write it with `tuner export -o {missing}`"
    with pytest.raises(ClientError, match=re.escape(said)):
        Client(server, file=missing)
    (tmp_path / "torn.json").write_text("{")
    with pytest.raises(ClientError, match=r"cannot read export file .*torn\.json"):
        Client.from_file(tmp_path / "torn.json")


def test_a_miss_enqueues_one_background_job(store: db.Store, server: str) -> None:
    client = Client(server, token=SUBMIT, enqueue_on_miss=True, enqueue_job={"trials": 2, "samples": 3})
    assert client.best(NAME, {"n": 1024}, device="cpu").match == "exact"  # exact: nothing to tune
    nearest = client.best(NAME, {"n": 2048}, device="cpu")
    assert nearest.match == "nearest"

    def jobs() -> list[db.JobRecord]:
        with store.session() as session:
            return db.list_jobs(session)

    wait_for(lambda: len(jobs()) == 1, 30, "the background job")
    (job,) = jobs()
    assert job.state == "queued" and job.trials == 2 and job.device_kind == "cpu"
    assert [t.shape for t in job.tasks] == [{"n": 2048}]
    client.invalidate()
    client.best(NAME, {"n": 2048}, device="cpu")
    time.sleep(0.5)
    assert len(jobs()) == 1, "enqueued once per shape"
    # another process's client (a fresh one) sees the queued job and submits none (after a version bump every
    # process would otherwise queue one per shape); another device name is another job
    other = Client(server, token=SUBMIT, enqueue_on_miss=True, enqueue_job={"trials": 2, "samples": 3})
    assert other.best(NAME, {"n": 2048}, device="cpu").match == "nearest"
    time.sleep(0.5)
    assert len(jobs()) == 1, "a queued job for the shape covers other processes"
    other.best(NAME, {"n": 2048}, device="cpu", device_name="other-cpu")
    wait_for(lambda: len(jobs()) == 2, 30, "the other device's job")

    refused = Client(server, token=READ, enqueue_on_miss=True)  # no submit scope: logged, never raised
    assert refused.best(NAME, {"n": 4096}, device="cpu").match == "nearest"
    time.sleep(0.5)
    assert len(jobs()) == 2


def test_a_carried_versions_exact_answer_enqueues_a_job_for_the_current_version(store: db.Store, server: str) -> None:
    """An exact answer from a best of a version the current one carries (MIMO version 4 serves version 2's) was
    not tuned under this version: with enqueue_on_miss the client queues one job for it, as for a miss."""
    mimo = "mamba3_mimo_bwd"
    r4 = {"B": 4, "S": 2048, "H": 16, "G": 1, "N": 128, "P": 64, "R": 4, "rotary_divisor": 4, "dtype": "bfloat16"}
    v2 = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
          "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4}
    publish(store, mimo, r4, v2, 3681.6, device_kind="cuda", device_name="NVIDIA H200", version="2")
    client = Client(server, token=SUBMIT, enqueue_on_miss=True, enqueue_job={"trials": 2, "samples": 3})
    best = client.best(mimo, r4, device="cuda")
    assert best.match == "exact" and best.carried
    assert dict(best.config) == {**v2, "state_pass": "scan", "qk_warps": "same"}

    def jobs() -> list[db.JobRecord]:
        with store.session() as session:
            return db.list_jobs(session)

    wait_for(lambda: len(jobs()) == 1, 30, "the background job")
    (job,) = jobs()
    assert (job.template, job.device_kind, [t.shape["R"] for t in job.tasks]) == (mimo, "cuda", [4])


def test_triton_launch_kwargs_split_options_from_meta_parameters() -> None:
    config = {"BLOCK": 64, "mode": "ok", "num_warps": 4, "num_stages": 2}
    assert split_launch_config(config) == ({"BLOCK": 64, "mode": "ok"}, {"num_warps": 4, "num_stages": 2})
    assert triton_launch_kwargs(config) == config
    # Given the kernel, meta-parameters it does not declare (read by the Python wrapper) are left out.
    assert triton_launch_kwargs(config, _scale) == {"BLOCK": 64, "num_warps": 4, "num_stages": 2}
    best = BestConfig(NAME, {"n": 1}, "cuda", "exact", {"BLOCK": 32, "num_ctas": 1}, "server")
    assert best.launch_kwargs() == {"BLOCK": 32, "num_ctas": 1}


def test_the_client_imports_neither_torch_nor_the_store_nor_http() -> None:
    heavy = ("torch", "triton", "httpx", "tuner.db", "sqlalchemy", "tuner.registry")
    code = f"import sys, tuner.service.client; print([m for m in {heavy!r} if m in sys.modules])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT, check=True)
    assert run.stdout.strip() == "[]"


def _export(store: db.Store, tmp_path: Path) -> Path:
    path = tmp_path / "best.json"
    assert "2 best config(s) of 1 template(s)" in export(store, path, NAME)
    return path


def test_the_export_file_repairs_an_invalid_nearest_config_as_the_server_does(
    store: db.Store, server: str, tmp_path: Path
) -> None:
    # The Mamba3 MIMO backward best tuned for R=4 on the H200: invalid for R=16 (C = 32 rows / 16 = 2 steps).
    r4 = {"B": 4, "S": 2048, "H": 16, "G": 1, "N": 128, "P": 64, "R": 4, "rotary_divisor": 4, "dtype": "bfloat16"}
    r4_best = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
               "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4}
    publish(store, "mamba3_mimo_bwd", r4, r4_best, 2023.7, device_kind="cuda", device_name="NVIDIA H200", version="2")
    path = tmp_path / "mimo.json"
    assert "1 best config(s) of 1 template(s)" in export(store, path, "mamba3_mimo_bwd")
    online, offline = Client(server, software=None), Client.from_file(path, software=None)
    shapes = ({**r4, "R": 16}, {**r4, "R": 16, "N": 64}, {**r4, "R": 2}, r4, {**r4, "R": 16, "S": 8})
    # another GPU asking too: the notes saying what was measured where come with the answer offline as online
    for shape, name in itertools.product(shapes, ("NVIDIA H200", "NVIDIA H100")):
        a = online.best("mamba3_mimo_bwd", shape, device="cuda", device_name=name)
        b = offline.best("mamba3_mimo_bwd", shape, device="cuda", device_name=name)
        assert (a.match, dict(a.config), a.repaired, a.notes, a.source_shape, a.measured_version, a.carried) == (
            b.match, dict(b.config), b.repaired, b.notes, dict(b.source_shape or {}) or None, b.measured_version,
            b.carried), (shape, name)
        elsewhere = "nothing measured on 'NVIDIA H100'; this config was measured on 'NVIDIA H200'"
        assert (elsewhere in b.notes) == (name == "NVIDIA H100" and b.match != "default"), (shape, b.notes)
    r16 = offline.best("mamba3_mimo_bwd", {**r4, "R": 16}, device="cuda", device_name="NVIDIA H200")
    # a version-2 best served by version 4 (which carries version 2) with the scan, version 2's state pass, and
    # qk_warps=same (one launch setting for both split2 kernels, as version 2 ran them)
    assert r16.match == "nearest"
    assert dict(r16.config) == {**r4_best, "state_pass": "scan", "qk_warps": "same", "chunk_rows": 64,
                                "num_warps": 4}
    assert r16.repaired == (ConfigChange("chunk_rows", 32, 64), ConfigChange("num_warps", 2, 4))
    assert any("template version 2" in note for note in r16.notes)
    assert (r16.template_version, r16.measured_version, r16.carried) == ("4", "2", True)


def test_a_busy_server_is_answered_from_the_file_not_raised(store: db.Store, tmp_path: Path) -> None:
    """A server (or its proxy) that answers 429 Too Many Requests or 408 is busy, not refusing the request: the
    application's lookup is answered from the export file, as in an outage (it raised ClientError, a crash in
    the caller's hot path)."""
    import http.server
    import threading

    class Busy(http.server.BaseHTTPRequestHandler):
        status = 429

        def do_GET(self) -> None:  # http.server's name for it
            self.send_response(type(self).status)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"detail": "slow down"}')

        def log_message(self, *args: object) -> None:
            pass

    path = _export(store, tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for status in (429, 408):
            Busy.status = status
            client = Client(f"http://127.0.0.1:{server.server_address[1]}", file=path, retry_s=5, timeout_s=2)
            answer = client.best(NAME, {"n": 1024}, device="cpu")
            assert answer.source == "file" and answer.config["BLOCK"] == 512
        Busy.status = 404  # a refusal still raises
        with pytest.raises(ClientError) as refused:
            Client(f"http://127.0.0.1:{server.server_address[1]}", file=path).best(NAME, {"n": 1024}, device="cpu")
        assert refused.value.status == 404
    finally:
        server.shutdown()


def test_a_refused_token_is_dropped_and_the_lookup_answered_without_it(
    store: db.Store, server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rotated or mistyped token must not stop the application's lookups: the server refuses it (401), the
    client says so once, reads without it (reads are open) and enqueues nothing; where the server wants a
    token for reads, the export file answers, else the caller's fallback, else ClientError says why."""
    def jobs() -> list[db.JobRecord]:
        with store.session() as session:
            return db.list_jobs(session)

    stale = Client(server, token="rotated-token-0123456789", enqueue_on_miss=True, enqueue_job={"trials": 2})
    with caplog.at_level("WARNING", logger="tuner.service.client"):
        answer = stale.best(NAME, {"n": 1024}, device="cpu")
        nearest = stale.best(NAME, {"n": 2048}, device="cpu")
    assert (answer.source, answer.match, nearest.source, nearest.match) == ("server", "exact", "server", "nearest")
    refusals = [r.getMessage() for r in caplog.records if "refused the client's token" in r.getMessage()]
    assert len(refusals) == 1 and "unknown token" in refusals[0], caplog.text
    time.sleep(0.5)
    assert jobs() == [], "a refused token submits nothing"

    path = _export(store, tmp_path)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False,  # type: ignore[arg-type]
                           best_cache_ttl_s=0, read_requires_token=True)
    with thread_server(settings, store) as closed:
        assert Client(closed, token=READ).best(NAME, {"n": 1024}, device="cpu").source == "server"
        from_file = Client(closed, token="rotated-token-0123456789", file=path).best(NAME, {"n": 1024}, device="cpu")
        assert from_file.source == "file" and from_file.config["BLOCK"] == 512
        with pytest.raises(ClientError) as no_file:
            Client(closed, token="rotated-token-0123456789").best(NAME, {"n": 1024}, device="cpu")
        assert no_file.value.status == 401 and "wants a token with the read scope" in str(no_file.value)
        assert "refused the client's token" in str(no_file.value)
        with pytest.raises(ClientError, match="the client has none"):
            Client(closed).best(NAME, {"n": 1024}, device="cpu")
        with caplog.at_level("WARNING", logger="tuner.service.client"):  # the caller's fallback, said aloud
            kept = Client(closed, token="rotated-token-0123456789").best(NAME, {"n": 1024}, device="cpu",
                                                                        fallback={"BLOCK": 64})
        assert kept.source == "fallback" and kept.config["BLOCK"] == 64
        assert "answering from the caller's fallback config" in caplog.text


@pytest.mark.parametrize(("url", "message"), [
    ("127.0.0.1:8000", "with its scheme, e.g. http://127.0.0.1:8000"),
    ("localhost:8000", "with its scheme"),
    ("http://127.0.0.1:8000/v1", "base address, http://127.0.0.1:8000, without /v1"),
    ("http://127.0.0.1:8000/v1/", "without /v1"),
])
def test_a_server_address_that_is_not_a_base_address_is_refused_with_its_fix(url: str, message: str) -> None:
    """Before: `Client("http://host:8000/v1")` sent /v1/v1/best and raised a bare "Not Found"; without a scheme
    it said the server was unavailable. The CLI says the same, as a usage error (exit 2)."""
    from tuner.service.remote import RemoteInputError, call

    with pytest.raises(ClientError, match=re.escape(message)):
        Client(url)
    with pytest.raises(RemoteInputError, match=re.escape(message)):
        call("GET", "/v1/jobs", url=url, token=None)


def test_a_base_address_keeps_its_path_and_loses_its_trailing_slash() -> None:
    assert server_base(" http://127.0.0.1:8000/ ") == "http://127.0.0.1:8000"
    assert server_base("https://tuner.example/api") == "https://tuner.example/api"  # behind a proxy's prefix
