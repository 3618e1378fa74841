"""Reliability under faults: real worker processes, a real PostgreSQL database, faults made with its own means.

For each scenario: a fresh database of its own on the local server, one CPU job of ``--trials`` trials on
the wide test template (tests/fixtures/fault_templates.py: 288 configs, so no config need repeat), three
workers (``--heartbeat 2 --lease 10``), and a fault while the job runs:

* ``blips``: 6 outages of 4 s (``ALTER DATABASE … ALLOW_CONNECTIONS false`` + ``pg_terminate_backend`` on
  this database only), 8 s apart;
* ``outage-15s``, ``outage-60s``: one outage, longer than the lease;
* ``partition``: the workers reach the database through a TCP proxy on 127.0.0.1 that holds every byte for
  20 s; an API server behind the same proxy is asked ``GET /v1/jobs`` meanwhile (how long until it answers);
* ``lost-answers``: the workers reach the database through a TCP proxy that loses the answer of every 200th
  COMMIT (passed on to the server, which commits it; the connection is closed before its answer comes back:
  the worker cannot know whether it committed), from the job's start to its end;
* ``mixed-fleet``: a worker without the template and one whose template does not import start first (the
  first never claims the job, the second withdraws the template it cannot load: no attempt charged to the
  task), then a capable one;
* ``sigkill-1``, ``sigkill-2``: one or two workers killed with SIGKILL mid-job;
* ``sigterm-hang``: one worker on a template whose every candidate hangs, sent SIGTERM inside a candidate
  (how long until it exits; the interrupted config must be queued again);
* ``fresh-starts``: ``--starts`` times, four workers started at once on an empty database (tuner's and
  Optuna's tables created by whoever comes first, the others waiting on the schema lock), then a 4-shape job
  of 2 trials per shape submitted.

Reported per scenario: worker deaths (exits other than the ones the scenario caused, or a traceback in a
worker's log), the job's state, measurements stored vs expected, configs measured twice, and the time from
the end of the fault to the job's next stored measurement. The PostgreSQL server is never stopped.

Run (writes benchmarks/reliability.md)::

    .venv/bin/python benchmarks/reliability.py --output benchmarks/reliability.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from tests.fixtures import fleet_templates, processes  # noqa: E402
from tests.fixtures.faults import FaultDatabase, Outcome, TcpProxy, submit, wait_job  # noqa: E402
from tuner import db  # noqa: E402
from tuner.frozen import Shape  # noqa: E402

WORKER_ARGS = ("--heartbeat", "2", "--lease", "10")


@dataclass
class Row:
    scenario: str
    deaths: int = 0
    state: str = ""
    measured: str = ""
    duplicates: int = 0
    recover_s: str = ""
    notes: list[str] = field(default_factory=list)


class Run:
    """One scenario's database, workers and logs."""

    def __init__(self, name: str, logs: Path, trials: int, proxy: bool = False) -> None:
        self.name, self.logs, self.trials = name, logs, trials
        self.database = FaultDatabase()
        self.proxy = TcpProxy(self.database.server_host, self.database.server_port) if proxy else None
        self.url = self.database.url(host="127.0.0.1", port=self.proxy.port) if self.proxy else self.database.url()
        self.store = db.Store.open(self.database.url())
        self.workers: list[subprocess.Popen[bytes]] = []
        self.expected_exits: set[int] = set()

    def start_workers(self, n: int, *, env: dict[str, str] | None = None) -> None:
        for _ in range(n):
            i = len(self.workers)
            log = self.logs / f"{self.name}-w{i}.log"
            out = open(log, "wb")  # noqa: SIM115 - the child owns the file
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", "worker", "--db", self.url, "--device", "cpu", *WORKER_ARGS],
                env=env or processes.env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            ))

    def measured_count(self, job_id: int) -> int:
        return Outcome.of(self.store, job_id).measured

    def wait_measured(self, job_id: int, n: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while self.measured_count(job_id) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: fewer than {n} measurements after {timeout_s:g} s")
            time.sleep(0.5)

    def next_measurement_after(self, job_id: int, timeout_s: float = 300) -> float:
        """Seconds until one more measurement is stored (how long the job took to move again)."""
        start, before = time.monotonic(), self.measured_count(job_id)
        while self.measured_count(job_id) <= before:
            outcome = Outcome.of(self.store, job_id)
            if outcome.state not in ("running", "queued") or time.monotonic() - start > timeout_s:
                break
            time.sleep(0.2)
        return time.monotonic() - start

    def finish(self, row: Row, job_id: int, expected: int, timeout_s: float = 900) -> Row:
        outcome = wait_job(self.store, job_id, timeout_s)
        row.state, row.measured, row.duplicates = outcome.state, f"{outcome.measured} / {expected}", outcome.duplicates
        row.deaths += self.deaths()
        self.close()
        return row

    def deaths(self) -> int:
        dead = 0
        for i, w in enumerate(self.workers):
            if i in self.expected_exits:
                continue
            code = w.poll()
            log = (self.logs / f"{self.name}-w{i}.log").read_text(errors="replace")
            if (code is not None and code != 0) or "Traceback" in log:
                dead += 1
        return dead

    def close(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        self.store.close()
        if self.proxy is not None:
            self.proxy.close()
        self.database.drop()


def outages(name: str, seconds: list[float], gap_s: float, logs: Path, trials: int) -> Row:
    run, row = Run(name, logs, trials), Row(name)
    job = submit(run.store, trials=trials)
    run.start_workers(3)
    run.wait_measured(job, 5)
    recoveries = []
    for s in seconds:
        with run.database.outage(s):
            pass
        recoveries.append(run.next_measurement_after(job))
        time.sleep(max(0.0, gap_s - recoveries[-1]))
    row.recover_s = f"{max(recoveries):.1f} (max of {len(recoveries)})"
    return run.finish(row, job, trials)


def partition(logs: Path, trials: int) -> Row:
    from tests.fixtures.servers import TOKENS, thread_server
    from tuner.api.settings import ApiSettings

    run, row = Run("partition", logs, trials, proxy=True), Row("partition")
    job = submit(run.store, trials=trials)
    run.start_workers(3)
    run.wait_measured(job, 5)
    api_store = db.Store.open(run.url)
    settings = ApiSettings(db_url=run.url, tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, api_store) as base, httpx.Client(base_url=base, timeout=120) as http:
        http.get("/v1/jobs")
        assert run.proxy is not None
        run.proxy.partition()
        started = time.monotonic()
        answer = http.get("/v1/jobs")
        answered = time.monotonic() - started
        time.sleep(max(0.0, 20 - answered))
        run.proxy.heal()
        row.recover_s = f"{run.next_measurement_after(job):.1f}"
        row.notes.append(f"GET /v1/jobs in the partition: {answer.status_code} after {answered:.1f} s")
    api_store.close()
    return run.finish(row, job, trials)


def lost_answers(logs: Path, trials: int, every: int = 200) -> Row:
    run, row = Run("lost-answers", logs, trials, proxy=True), Row("lost-answers")
    assert run.proxy is not None
    job = submit(run.store, trials=trials)
    run.proxy.lose_commit_answers(every)
    started = time.monotonic()
    run.start_workers(3)
    wait_job(run.store, job, 900)
    row.recover_s = f"job in {time.monotonic() - started:.0f}"
    (task,) = run.store.get_job(job_id=job).tasks  # type: ignore[union-attr]
    finals = run.store.list_measurements(study_id=task.study_id, role="final") if task.study_id else []
    best = run.store.get_study_best(study_id=task.study_id) if task.study_id else None
    rounds = len({f.round_id for f in finals})
    twice = len(finals) - len({(f.candidate, f.config_json) for f in finals})
    claims = sum((logs / f"lost-answers-w{i}.log").read_text(errors="replace").count(" interrupted: ")
                 for i in range(len(run.workers)))
    published = best is not None and best.measurement_id in {f.id for f in finals}
    row.notes.append(f"{run.proxy.answers_lost} of {run.proxy.commits} COMMIT answers lost; final rounds stored: "
                     f"{rounds} ({len(finals)} rows, {twice} stored twice), published: {published}; "
                     f"task attempts left on a store error and claimed again: {claims}")
    return run.finish(row, job, trials)


def mixed_fleet(logs: Path, trials: int) -> Row:
    run, row = Run("mixed-fleet", logs, trials), Row("mixed-fleet")
    job = submit(run.store, trials=trials)
    run.start_workers(1, env=fleet_templates.lacking_env())
    run.start_workers(1, env=fleet_templates.broken_env())

    def task() -> db.TaskRecord:
        found = run.store.get_job(job_id=job)
        assert found is not None
        return found.tasks[0]

    template = run.store.get_job(job_id=job).template  # type: ignore[union-attr]

    def withdrawn() -> bool:  # both registered, neither advertising the job's template any more
        live = run.store.list_workers()
        return len(live) >= 2 and all(w.templates is not None and template not in w.templates for w in live)

    processes.wait_for(withdrawn, 300, "the worker that cannot import the template to withdraw it")
    before = Outcome.of(run.store, job)
    run.start_workers(1)
    wait_job(run.store, job, 900)
    attempts = run.store.list_attempts(task_id=task().id)
    row.notes.append(f"before the capable worker started: job {before.state}, {before.measured} measured, neither "
                     f"worker advertising {template} (the one that cannot import it withdrew it); attempts charged "
                     f"to the task: {len(attempts)}")
    return run.finish(row, job, trials)


def sigkill(n: int, logs: Path, trials: int) -> Row:
    name = f"sigkill-{n}"
    run, row = Run(name, logs, trials), Row(name)
    job = submit(run.store, trials=trials)
    run.start_workers(3)
    run.wait_measured(job, max(2, trials // 5))  # mid-job
    for i in range(n):
        run.workers[i].kill()
        run.expected_exits.add(i)
    row.recover_s = f"{run.next_measurement_after(job):.1f}"
    return run.finish(row, job, trials)


def sigterm_hang(logs: Path) -> Row:
    run, row = Run("sigterm-hang", logs, 3), Row("sigterm-hang")
    job = submit(run.store, trials=3, template="fault_vector_scale_hang_all", timeout_s=600)
    run.start_workers(1)
    engine = create_engine(run.database.url(), poolclass=NullPool)

    def measuring() -> bool:
        with engine.connect() as conn:
            if not conn.execute(text("SELECT to_regclass('trials') IS NOT NULL")).scalar():
                return False
            return bool(conn.execute(text(
                "SELECT count(*) FROM trials t JOIN trial_params p ON p.trial_id = t.trial_id "
                "WHERE t.state = 'RUNNING'")).scalar())

    processes.wait_for(measuring, 600, "a hanging measurement")
    time.sleep(3)
    started = time.monotonic()
    run.workers[0].send_signal(signal.SIGTERM)
    code = run.workers[0].wait(timeout=120)
    took = time.monotonic() - started
    with engine.connect() as conn:
        waiting = conn.execute(text("SELECT count(*) FROM trials WHERE state = 'WAITING'")).scalar()
    engine.dispose()
    outcome = Outcome.of(run.store, job)
    row.state, row.measured = f"{outcome.state} (stopped)", f"{outcome.measured} / 0"
    row.recover_s = f"exit {took:.1f} s"
    row.notes.append(f"SIGTERM inside a hanging candidate: exit code {code} after {took:.1f} s; "
                     f"configs queued again: {waiting}")
    row.deaths = int(code != 0)
    run.expected_exits.add(0)
    run.close()
    return row


def fresh_starts(logs: Path, starts: int) -> Row:
    row = Row(f"fresh-starts x{starts}")
    done = measured = 0
    for k in range(starts):
        run = Run(f"fresh{k}", logs, 2)
        run.store.close()
        run.database.reset()  # empty: the workers (and this process, a fifth) race to create every table
        run.start_workers(4)
        run.store = db.Store.open(run.database.url())
        shapes = [Shape(n=n) for n in (64, 128, 256, 512)]
        with run.store.session() as session:
            job = db.create_job(
                session, template="fault_vector_scale_wide", template_version="1", backend="triton",
                device_kind="cpu", device_name=None, trials=2, sampler="random", seed=k, samples=2,
                candidate_timeout_s=60.0, finalists=1, comparators=False,
                tasks=[(s.key(), s.key(), s.to_json()) for s in shapes],
            ).id
        outcome = wait_job(run.store, job, 600)
        done += outcome.state == "done"
        measured += outcome.measured
        row.duplicates += outcome.duplicates
        row.deaths += run.deaths()
        run.close()
    row.state, row.measured = f"{done} of {starts} done", f"{measured} / {8 * starts}"
    return row


SCENARIOS: dict[str, Callable[[Path, argparse.Namespace], Row]] = {
    "blips": lambda logs, a: outages("blips", [4.0] * 6, 8.0, logs, a.trials),
    "outage-15s": lambda logs, a: outages("outage-15s", [15.0], 0.0, logs, a.trials),
    "outage-60s": lambda logs, a: outages("outage-60s", [60.0], 0.0, logs, a.trials),
    "partition": lambda logs, a: partition(logs, a.trials),
    "lost-answers": lambda logs, a: lost_answers(logs, a.trials),
    "mixed-fleet": lambda logs, a: mixed_fleet(logs, a.trials),
    "sigkill-1": lambda logs, a: sigkill(1, logs, a.trials),
    "sigkill-2": lambda logs, a: sigkill(2, logs, a.trials),
    "sigterm-hang": lambda logs, a: sigterm_hang(logs),
    "fresh-starts": lambda logs, a: fresh_starts(logs, a.starts),
}


def render(rows: list[Row], args: argparse.Namespace, took_s: float) -> str:
    lines = [
        "# Reliability under database faults",
        "",
        f"Command: `nice -n 10 .venv/bin/python benchmarks/reliability.py {' '.join(sys.argv[1:])}`  ",
        f"Machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} CPU cores shared with other work, no GPU"
        f" used), PostgreSQL on 127.0.0.1; finished {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
        f" UTC after {took_s / 60:.0f} min.  ",
        f"Job: {args.trials} trials of fault_vector_scale_wide (CPU, Triton interpreter), 3 workers "
        "`--heartbeat 2 --lease 10`; faults as in the script's docstring.",
        "Targets: 0 deaths, every job done, exactly the trial count measured, 0 duplicates, the partition "
        "answered within 5 s, SIGTERM exit within 5 s.",
        "",
        "| scenario | worker deaths | job state | measured / expected | configs measured twice "
        "| time to recover (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.scenario} | {r.deaths} | {r.state} | {r.measured} | {r.duplicates} | {r.recover_s} |")
    notes = [f"- {r.scenario}: {n}" for r in rows for n in r.notes]
    if notes:
        lines += ["", *notes]
    lines += ["", "Time to recover: from the end of the fault to the job's next stored measurement."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run these scenarios only")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/tuner-reliability"))
    parser.add_argument("--output", type=Path, default=Path("benchmarks/reliability.md"))
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows: list[Row] = []
    names = args.only or list(SCENARIOS)
    for name in names:
        print(f"{name} …", flush=True)
        try:
            rows.append(SCENARIOS[name](args.logs, args))
        except Exception as exc:  # a scenario that cannot complete is a result too
            rows.append(Row(name, state=f"not completed: {type(exc).__name__}: {exc}"))
        print(rows[-1], flush=True)
        text_ = render(rows, args, time.monotonic() - started)
        if len(rows) < len(names):  # written after each scenario: a run cut short still leaves its figures
            text_ += f"\nPartial: {len(rows)} of {len(names)} scenarios so far; not yet run: " \
                     f"{', '.join(names[len(rows):])}.\n"
        args.output.write_text(text_)
    print(text_)


if __name__ == "__main__":
    main()
