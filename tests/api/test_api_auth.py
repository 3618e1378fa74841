"""Bearer tokens and scopes: 401 without (or with an unknown) token, 403 without the scope, reads open unless
the server requires the read scope; tokens never appear in answers or logs."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.fixtures.servers import READ, SUBMIT, TOKENS, WORKER, auth, thread_server
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
JOB = {"template": NAME, "shapes": [{"n": 256}], "device": {"kind": "cpu"}, "trials": 2}
BEST = {"template": NAME, "device": "cpu", "n": 256}


def _settings(tmp_path: Path, **kw: object) -> ApiSettings:
    return ApiSettings(db_url=db.sqlite_url(tmp_path / "t.db"), tokens=TOKENS, warm_templates=False, **kw)  # type: ignore[arg-type]


def test_submitting_and_cancelling_need_the_submit_scope(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with thread_server(_settings(tmp_path)) as base, httpx.Client(base_url=base) as http:
        none = http.post("/v1/jobs", json=JOB)
        assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
        assert "'Authorization: Bearer <token>'" in none.text and "$TUNER_HOME/token" in none.text  # how to give one
        basic = http.post("/v1/jobs", json=JOB, headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert basic.status_code == 401
        wrong = http.post("/v1/jobs", json=JOB, headers=auth("not-a-known-token"))
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        assert "not-a-known-token" not in wrong.text
        for token in (READ, WORKER):
            refused = http.post("/v1/jobs", json=JOB, headers=auth(token))
            assert refused.status_code == 403 and "'submit' scope" in refused.text and token not in refused.text
        assert http.get("/v1/jobs").json()["total"] == 0, "refused submissions store nothing"

        created = http.post("/v1/jobs", json=JOB, headers=auth(SUBMIT))
        assert created.status_code == 201
        job_id = created.json()["id"]
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 401
        assert http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(READ)).status_code == 403
        cancelled = http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(SUBMIT))
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        again = http.post(f"/v1/jobs/{job_id}/cancel", headers=auth(SUBMIT))
        assert again.status_code == 409 and "already cancelled" in again.text
        assert http.post("/v1/jobs/999/cancel", headers=auth(SUBMIT)).status_code == 404

        # Reads are open by default, with or without a token.
        for headers in ({}, auth(READ), auth(SUBMIT), auth(WORKER)):
            assert http.get("/v1/jobs", headers=headers).status_code == 200
            assert http.get("/v1/best", params=BEST, headers=headers).status_code == 200
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    for token in (SUBMIT, READ, WORKER, "not-a-known-token"):
        assert token not in logged


def test_the_cli_says_where_a_token_and_a_server_come_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tuner submit`` & co. (tuner.service.remote.call): a refused token (401 unknown, 403 without the scope)
    says how to give one; an unreachable server says how to start or name one. Tokens are never echoed."""
    from tests.fixtures.servers import free_port
    from tuner.service.remote import RemoteInputError, call

    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_TOKEN", raising=False)
    hint = f"--token or $TUNER_TOKEN; a server without TUNER_TOKENS wrote its token to {tmp_path / 'home' / 'token'}"
    with thread_server(_settings(tmp_path)) as base:
        for token, start in ((None, "401: Authorization: "), ("not-a-known-token", "401: Authorization: unknown token"),
                             (READ, "403: ")):
            with pytest.raises(RemoteInputError) as refused:
                call("POST", "/v1/jobs", url=base, token=token, json=JOB)
            message = str(refused.value)
            assert message.startswith(start) and hint in message and (token is None or token not in message)
        with pytest.raises(RemoteInputError) as missing:
            call("GET", "/v1/jobs/999", url=base, token=None)
        assert str(missing.value) == "404: job_id: no job 999"  # no token hint where the token is not the problem
    with pytest.raises(RemoteInputError) as unreachable:
        call("GET", "/v1/jobs", url=f"http://127.0.0.1:{free_port()}", token=None)
    said = str(unreachable.value)
    assert said.startswith("cannot reach the tuner server")
    assert said.endswith("(start one with `tuner serve`, or give its address with --url or $TUNER_URL)")


def test_reads_can_require_the_read_scope(tmp_path: Path) -> None:
    with thread_server(_settings(tmp_path, read_requires_token=True)) as base, httpx.Client(base_url=base) as http:
        for path, params in (("/v1/jobs", {}), ("/v1/best", BEST), ("/v1/templates", {}), ("/v1/workers", {}),
                             (f"/v1/templates/{NAME}", {})):
            none = http.get(path, params=params)
            assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer", path
            assert http.get(path, params=params, headers=auth(WORKER)).status_code == 403, path
            assert http.get(path, params=params, headers=auth(READ)).status_code == 200, path
        # A cached answer is not a way around the check.
        assert http.get("/v1/best", params=BEST).status_code == 401
        assert http.get("/healthz").status_code == 200


def test_token_settings_are_checked_without_naming_tokens() -> None:
    secret = "a-secret-token-value"
    with pytest.raises(ValueError) as bad_scope:
        ApiSettings(tokens={secret: ["submit", "admin"]})  # type: ignore[dict-item]
    assert "unknown scope(s) admin" in str(bad_scope.value) and secret not in str(bad_scope.value)
    with pytest.raises(ValueError, match="at least 8 characters"):
        ApiSettings(tokens={"short": ["read"]})  # type: ignore[dict-item]
    settings = ApiSettings(tokens={secret: ["read"]})  # type: ignore[dict-item]
    assert secret not in repr(settings) and secret not in str(settings)
    assert settings.scopes_of(secret) == frozenset({"read"}) and settings.scopes_of(secret[:-1]) is None


def test_tokens_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_TOKENS", '{"env-token-123456": ["submit", "read"]}')
    monkeypatch.setenv("TUNER_READ_REQUIRES_TOKEN", "true")
    settings = ApiSettings()
    assert settings.scopes_of("env-token-123456") == frozenset({"submit", "read"})
    assert settings.read_requires_token
