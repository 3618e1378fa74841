"""Input at the edges of what the store can hold: refused with 422 on every backend, never a 5xx.

One test per row of issue 14's table on API input: ids and offsets beyond 64 bits; NaN, Infinity and lone
surrogates (refused as JSON, the connection kept open); NUL bytes and over-long text; huge shape dims; lax
types; a value the database itself refuses (422/409, never 503).
"""

from __future__ import annotations

import json
import socket
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
TOO_BIG = 2**63  # one past the largest 64-bit id


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, db.Store]]:
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry

    registry.register(NAME, TUNABLE_REF)
    if request.param == "sqlite":
        url = db.sqlite_url(tmp_path_factory.mktemp("limits") / "t.db")
    else:
        url = request.getfixturevalue("postgres_sandbox").new_url()
    store = db.Store.open(url)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base:
        yield base, store
    store.close()


def _jobs(store: db.Store) -> int:
    with store.session() as session:
        return db.count_jobs(session)


def _assert_422(response: httpx.Response, loc: list[Any] | None = None) -> None:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    if loc is not None:
        assert any(e["loc"][: len(loc)] == loc for e in detail), detail


def test_ids_offsets_and_limits_beyond_64_bits_are_422(server: tuple[str, db.Store]) -> None:
    base, _ = server
    with httpx.Client(base_url=base, headers=auth(SUBMIT)) as http:
        _assert_422(http.get("/v1/jobs", params={"offset": TOO_BIG}), ["query", "offset"])
        _assert_422(http.get("/v1/jobs", params={"limit": TOO_BIG}), ["query", "limit"])
        _assert_422(http.get(f"/v1/jobs/{TOO_BIG}"), ["path", "job_id"])
        _assert_422(http.get("/v1/jobs/-500000000000000000000"), ["path", "job_id"])
        _assert_422(http.post("/v1/jobs/-500000000000000000000/cancel"), ["path", "job_id"])
        _assert_422(http.get("/v1/history", params={"template": NAME, "device": "cpu", "n": 8, "offset": TOO_BIG}),
                    ["query", "offset"])
        _assert_422(http.get("/v1/history", params={"template": NAME, "device": "cpu", "n": 8,
                                                    "study_id": TOO_BIG}), ["query", "study_id"])
        for path in (f"/v1/studies/{TOO_BIG}", f"/v1/studies/{TOO_BIG}/trials", f"/v1/studies/{TOO_BIG}/importance",
                     "/v1/studies/-500000000000000000000"):
            _assert_422(http.get(path), ["path", "study_id"])
        # The largest possible values are answered normally.
        assert http.get("/v1/jobs", params={"offset": TOO_BIG - 1}).json()["items"] == []
        assert http.get(f"/v1/jobs/{TOO_BIG - 1}").status_code == 404
        assert http.get(f"/v1/studies/{TOO_BIG - 1}").status_code == 404


def _raw_exchange(base: str, requests: list[bytes]) -> list[bytes]:
    """Send requests one after another on ONE connection; each response's head and body (fails if the
    server closes the connection before answering them all)."""
    host, port = base.removeprefix("http://").split(":")
    answers = []
    with socket.create_connection((host, int(port)), timeout=10) as sock, sock.makefile("rb") as stream:
        for request in requests:
            sock.sendall(request)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = stream.readline()
                assert line, f"the server closed the connection; answered {len(answers)} of {len(requests)}"
                head += line
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            answers.append(head + stream.read(length))
    return answers


def _post(body: bytes) -> bytes:
    return (b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {SUBMIT}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


@pytest.mark.parametrize("bad", [
    b'"trials": NaN', b'"trials": Infinity', b'"candidate_timeout_s": NaN', b'"candidate_timeout_s": -Infinity',
    b'"template": "\\ud800"', b'"device": {"kind": "cpu", "name": "\\udfff"}', b'"shapes": [{"\\ud800": 1}]',
    b'"shapes": [{"n": NaN}]', b'"workloads": ["\\ud83d"]',
])
def test_nan_infinity_and_lone_surrogates_are_422_json_and_the_connection_stays_open(
    server: tuple[str, db.Store], bad: bytes
) -> None:
    base, store = server
    before = _jobs(store)
    good = json.dumps({k: v for k, v in GOOD.items() if k not in ("device",)})[1:-1].encode()
    body = b"{" + good + b", " + bad + (b"" if b'"device"' in bad else b', "device": {"kind": "cpu"}') + b"}"
    first, second = _raw_exchange(base, [_post(body), b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"])
    head, _, payload = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 422"), first
    detail = json.loads(payload)["detail"]  # valid JSON
    assert isinstance(detail, list) and detail
    assert second.startswith(b"HTTP/1.1 200"), second
    assert _jobs(store) == before


@pytest.mark.parametrize(("changes", "loc"), [
    ({"device": {"kind": "cpu", "name": "gpu\x00"}}, ["body", "device", "name"]),
    ({"device": {"kind": "cpu", "name": "x" * 257}}, ["body", "device", "name"]),
    ({"template": "x" * 129}, ["body", "template"]),
    ({"template": "fault\x00"}, ["body", "template"]),
    ({"shapes": [], "workloads": ["w\x00"]}, ["body", "workloads", 0]),
    ({"shapes": [{"n": int("9" * 251)}]}, ["body", "shapes", 0]),  # its label would overflow VARCHAR(256)
    ({"shapes": [{"n\x00": 1}]}, ["body", "shapes", 0]),
])
def test_nul_bytes_and_over_long_text_are_422_on_every_backend(
    server: tuple[str, db.Store], changes: dict[str, Any], loc: list[Any]
) -> None:
    base, store = server
    before = _jobs(store)
    _assert_422(httpx.post(f"{base}/v1/jobs", json={**GOOD, **changes}, headers=auth(SUBMIT)), loc)
    assert _jobs(store) == before


@pytest.mark.parametrize(("n", "message"), [
    (10**30, "must be <= 2147483647"), (2**62, "must be <= 2147483647"), (2**31, "must be <= 2147483647"),
])
def test_shape_dims_are_bounded_by_the_template(server: tuple[str, db.Store], n: int, message: str) -> None:
    base, store = server
    before = _jobs(store)
    response = httpx.post(f"{base}/v1/jobs", json={**GOOD, "shapes": [{"n": n}]}, headers=auth(SUBMIT))
    _assert_422(response, ["body", "shapes", 0])
    assert message in response.text
    best = httpx.get(f"{base}/v1/best", params={"template": NAME, "device": "cpu", "n": n})
    _assert_422(best, ["query", "shape"])
    assert _jobs(store) == before
    described = httpx.get(f"{base}/v1/templates/{NAME}").json()
    assert described["dims"][0]["maximum"] == 2**31 - 1 and described["max_elements"] == 2**40


def test_the_total_size_bound_is_the_templates() -> None:
    import dataclasses

    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry
    from tuner.errors import ShapeError

    registry.register(NAME, TUNABLE_REF)
    small = dataclasses.replace(registry.get(NAME).spec, max_elements=1000)
    assert small.make_shape({"n": 1000})["n"] == 1000
    with pytest.raises(ShapeError, match=r"shape too large .* 1001 elements, at most 1000"):
        small.make_shape({"n": 1001})


@pytest.mark.parametrize(("changes", "loc"), [
    ({"trials": "40"}, ["body", "trials"]),
    ({"trials": True}, ["body", "trials"]),
    ({"trials": 40.0}, ["body", "trials"]),
    ({"comparators": "yes"}, ["body", "comparators"]),
    ({"comparators": 1}, ["body", "comparators"]),
    ({"samples": "3"}, ["body", "samples"]),
    ({"priority": False}, ["body", "priority"]),
    ({"candidate_timeout_s": "60"}, ["body", "candidate_timeout_s"]),
])
def test_numbers_and_booleans_are_strict(server: tuple[str, db.Store], changes: dict[str, Any], loc: list[Any]) -> None:
    base, store = server
    before = _jobs(store)
    _assert_422(httpx.post(f"{base}/v1/jobs", json={**GOOD, **changes}, headers=auth(SUBMIT)), loc)
    assert _jobs(store) == before
    ok = httpx.post(f"{base}/v1/jobs", json={**GOOD, "candidate_timeout_s": 60}, headers=auth(SUBMIT))
    assert ok.status_code == 201, "an integer is a valid float"


def test_values_the_database_refuses_are_422_or_409_not_503(server: tuple[str, db.Store]) -> None:
    """Behind the API's own checks, the store's session scope turns data errors into caller errors."""
    _, store = server
    with pytest.raises(db.RecordRejectedError), store.session() as session:
        db.get_job(session, job_id=2**70)
    kw: dict[str, Any] = dict(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                              trials=1, sampler="random", samples=1, candidate_timeout_s=1.0)
    if store.dialect == "postgresql":  # SQLite stores NUL and long text as given
        with pytest.raises(db.RecordRejectedError), store.session() as session:
            db.create_job(session, device_name="a\x00b", tasks=[("x", "n=1", '{"n": 1}')], **kw)
    with pytest.raises(db.RecordRejectedError), store.session() as session:
        db.create_job(session, device_name="\ud800", tasks=[("x", "n=1", '{"n": 1}')], **kw)


def test_the_local_token_file_must_be_private_and_long_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.errors import UserInputError
    from tuner.service.remote import local_token, resolve_token

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    monkeypatch.delenv("TUNER_TOKEN", raising=False)
    path = tmp_path / "token"
    path.write_text("a\n")
    path.chmod(0o666)
    with pytest.raises(UserInputError, match="accessible by group or others"):
        resolve_token(None)
    path.chmod(0o600)
    with pytest.raises(UserInputError, match="shorter than 8 characters"):
        local_token(create=True)
    path.write_text("long-enough-token\n")
    path.chmod(0o640)
    with pytest.raises(UserInputError, match="mode 640"):
        local_token(create=False)
    path.chmod(0o600)
    assert resolve_token(None) == "long-enough-token"
    path.unlink()
    created = local_token(create=True)
    assert created and len(created) >= 32 and (path.stat().st_mode & 0o777) == 0o600


def test_openapi_says_which_operations_need_a_token(tmp_path: Path) -> None:
    from tuner.api.main import create_app

    for read_requires_token in (False, True):
        settings = ApiSettings(db_url=db.sqlite_url(tmp_path / "t.db"), tokens=TOKENS,  # type: ignore[arg-type]
                               read_requires_token=read_requires_token, warm_templates=False)
        paths = create_app(settings).openapi()["paths"]
        reads = [paths[p]["get"] for p in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/best", "/v1/templates",
                                           "/v1/history", "/v1/workers")]
        for op in reads:
            optional = {} in op["security"]
            assert optional is not read_requires_token, op["operationId"]
        for op in (paths["/v1/jobs"]["post"], paths["/v1/jobs/{job_id}/cancel"]["post"]):
            assert {} not in op["security"] and {"401", "403", "400", "413", "422", "503"} <= set(op["responses"])
        assert "503" in paths["/v1/best"]["get"]["responses"]
        assert "503" not in paths["/v1/templates"]["get"]["responses"]

