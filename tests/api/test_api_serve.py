"""``tuner serve`` with its local worker, driven by the CLI over HTTP (submit, jobs, status, cancel), then
stopped with SIGTERM: the worker child goes with it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import ROOT, env, wait_for
from tests.fixtures.servers import free_port, start_serve
from tuner import db

NAME = "fault_vector_scale_tunable"


def tuner(*args: str, home: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**env(), "TUNER_HOME": str(home), **(extra_env or {})},
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    stat_line = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat_line


@pytest.mark.slow
def test_serve_with_its_worker_and_the_cli_over_http(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = db.sqlite_url(tmp_path / "t.db")
    serve = start_serve(url, port, "--device", "cpu", home=home, log=tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        token_file = home / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600  # no TUNER_TOKENS: a local token
        assert f"exploration pages: http://127.0.0.1:{port}/" in (tmp_path / "serve.log").read_text()
        submitted = tuner("submit", NAME, "--shape", "n=256", "--trials", "3", "--device", "cpu", "--samples", "3",
                          "--no-comparators", "--sampler", "random", "--url", base, home=home)
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.startswith("job 1 queued: fault_vector_scale_tunable, 1 shape(s) × 3 trials on cpu")

        def done() -> bool:
            return bool(httpx.get(f"{base}/v1/jobs/1").json()["state"] == "done")

        wait_for(done, 180, "the local worker to finish the job", interval=0.5)
        status = tuner("status", "1", "--url", base, home=home)
        assert status.returncode == 0 and "job 1 done" in status.stdout and "3/3" in status.stdout
        listed = json.loads(tuner("jobs", "--json", "--url", base, home=home).stdout)
        assert listed["total"] == 1 and listed["items"][0]["state"] == "done"

        # HTTP errors: one line, exit 2 on 4xx.
        for args, message in (
            (("cancel", "1"), "error: 409: job 1 is already done"),
            (("status", "7"), "error: 404: job_id: no job 7"),
            (("submit", "nope", "--shape", "n=1", "--device", "cpu"), "error: 404: template: unknown template 'nope'"),
            (("submit", NAME, "--shape", "n=1", "--trials", "0", "--device", "cpu"),
             "error: 422: trials: Input should be greater than or equal to 1"),
        ):
            run = tuner(*args, "--url", base, home=home)
            lines = run.stderr.strip().splitlines()
            assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), run.stderr
        wrong = tuner("submit", NAME, "--shape", "n=1", "--device", "cpu", "--url", base, home=tmp_path / "elsewhere",
                      extra_env={"TUNER_TOKEN": "not-the-token"})
        assert wrong.returncode == 2 and "401: Authorization: unknown token" in wrong.stderr
        assert "not-the-token" not in wrong.stderr
        unreachable = tuner("jobs", "--url", f"http://127.0.0.1:{free_port()}", home=home)
        assert unreachable.returncode == 2 and "cannot reach the tuner server" in unreachable.stderr
        api_path = tuner("jobs", "--url", f"{base}/v1", home=home)  # before: "error: 404: Not Found"
        assert api_path.returncode == 2 and f"give the server's base address, {base}, without /v1" in api_path.stderr
        # a job no live worker can take says so when it is submitted (this server's worker is a CPU one)
        cuda = tuner("submit", NAME, "--shape", "n=64", "--trials", "1", "--url", base, home=home)
        assert cuda.returncode == 0 and "on cuda" in cuda.stdout, cuda.stderr
        assert "waiting: no live worker of device cuda" in cuda.stderr and "--device cpu" in cuda.stderr
        status = tuner("status", cuda.stdout.split()[1], "--url", base, home=home)  # says it again, with the hint
        assert "waiting: no live worker of device cuda" in status.stdout and "--device cpu" in status.stdout
        assert tuner("cancel", cuda.stdout.split()[1], "--url", base, home=home).returncode == 0

        (worker,) = httpx.get(f"{base}/v1/workers").json()
        assert worker["state"] == "idle" and worker["device_kind"] == "cpu"
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=90) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert not _alive(worker["pid"]), "the worker child stopped with the server"
    with db.Store.open(url) as store, store.session() as session:
        (w,) = db.list_workers(session, include_stopped=True)
    assert w.state == "stopped"  # it left cleanly, giving back its lease


def test_serve_refuses_bad_settings_in_one_line(tmp_path: Path) -> None:
    run = tuner("serve", "--db", db.sqlite_url(tmp_path / "t.db"), "--no-worker", home=tmp_path,
                extra_env={"TUNER_TOKENS": '{"a-secret-token": ["root"]}'})
    assert run.returncode == 2 and "unknown scope(s) root" in run.stderr and "a-secret-token" not in run.stderr
    bad_db = tuner("serve", "--db", "postgresql+psycopg://u:pw@127.0.0.1:1/x", "--no-worker", home=tmp_path)
    assert bad_db.returncode == 2 and "127.0.0.1:1" in bad_db.stderr and "pw" not in bad_db.stderr
    out = tmp_path / "best.json"
    url = db.sqlite_url(tmp_path / "t.db")
    unknown = tuner("export", "--template", "nope", "-o", str(out), "--db", url, home=tmp_path)
    assert unknown.returncode == 2 and "unknown template 'nope'" in unknown.stderr and not out.exists()


def test_serve_stops_when_its_worker_cannot_start_on_this_host(tmp_path: Path) -> None:
    """``tuner serve --device cuda`` on a host without CUDA: the worker child's refusal stops the server (exit 2,
    the worker's error and the way out in its output). It kept serving with the child a zombie: jobs queued
    there waited for a worker that never started, and nothing said so."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the worker starts")
    run = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "serve", "--port", str(free_port()), "--db",
         db.sqlite_url(tmp_path / "t.db"), "--device", "cuda", "--no-access-log"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**env(), "TUNER_HOME": str(tmp_path / "home")})
    assert run.returncode == 2, run.stderr[-3000:]
    assert "device kind 'cuda' is not available on this host" in run.stderr
    assert "the local worker could not start" in run.stderr and "--no-worker" in run.stderr


@pytest.mark.slow
def test_a_ctrl_c_stops_serve_and_its_worker_without_an_error(tmp_path: Path) -> None:
    """SIGINT to the terminal's process group (a Ctrl-C): the server shuts down, then stops its worker, exit 0,
    and nothing says the worker failed (it got the same SIGINT first and the watcher logged it as gone)."""
    import time

    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), "--db", db.sqlite_url(tmp_path / "t.db"),
             "--device", "cpu", "--no-access-log"],
            env={**env(), "TUNER_HOME": str(tmp_path / "home")}, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)  # a process group of its own, as a shell gives a command
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(base) and bool(httpx.get(f"{base}/v1/workers", timeout=5).json()), 120,
                 "the server and its worker")
        time.sleep(1.0)
        os.killpg(serve.pid, signal.SIGINT)
        code = serve.wait(timeout=90)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "exited with code" not in text and "could not start" not in text, text[-3000:]


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
