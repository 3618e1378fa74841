"""Render time of the exploration pages over HTTP, on copies of real stores (the committed H200 ones).

Serves ``create_app`` with uvicorn in this process (templates warmed as ``tuner serve`` does), requests every
page once to warm up, then every page ``--repeat`` times in rounds, and reports per page kind the p50, p95
and max of the time from sending the request to having read the whole body (server render + transfer on
localhost). The pages: the overview, every template page (per device), the template page with its lookup form
sent (per template and device: the first study's shape with its first integer dim doubled), every study page,
and a compare page per pair of consecutive studies. The stores are copied to a temporary folder first: nothing
is written to the committed files.

    python benchmarks/ui_render.py benchmarks/h200/chunk_cumsum.db benchmarks/h200/mamba3_mimo_bwd.db \\
        --output benchmarks/ui_render.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import httpx
import uvicorn

from tuner import db
from tuner.api.main import create_app
from tuner.api.settings import ApiSettings
from tuner.db.explore import StudySummary, list_study_summaries
from tuner.frozen import scalar_text


def _serve(store: db.Store) -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(ApiSettings(warm_templates=True), store), log_level="warning",
                            access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def _pages(store: db.Store) -> list[tuple[str, str]]:
    with store.session(readonly=True) as session:
        summaries, _ = list_study_summaries(session)
    studies = sorted(s.study.id for s in summaries)
    by_template = sorted({(s.study.template, s.study.device_name) for s in summaries})
    pages = [("overview", "/")]
    pages += [("template", f"/ui/templates/{t}?device={d}") for t, d in by_template]
    pages += [("template, asked", _asked(s.study)) for s in _first_per(summaries)]
    pages += [("study", f"/ui/studies/{i}") for i in studies]
    pages += [("compare", f"/ui/compare?study={a}&study={b}") for a, b in itertools.pairwise(studies)]
    return pages


def _first_per(summaries: Sequence[StudySummary]) -> list[StudySummary]:
    """The first study of each (template, device name)."""
    seen: dict[tuple[str, str], StudySummary] = {}
    for s in sorted(summaries, key=lambda s: s.study.id):
        seen.setdefault((s.study.template, s.study.device_name), s)
    return list(seen.values())


def _asked(study: db.StudyRecord) -> str:
    """The template page with its lookup form sent for a shape nobody tuned: the study's shape with its first
    integer dim doubled (a nearest answer, or the default)."""
    shape = json.loads(study.shape_json)
    first = next(k for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool))
    shape[first] *= 2
    dims = "&".join(f"shape.{k}={scalar_text(v)}" for k, v in shape.items())
    return f"/ui/templates/{study.template}?device={study.device_name}&kind={study.device_kind}&{dims}"


def measure(path: Path, repeat: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        db.copy_database(path, copy)
        store = db.Store.open(db.sqlite_url(copy))
        base, server, thread = _serve(store)
        times: dict[str, list[float]] = {}
        try:
            with httpx.Client(base_url=base, timeout=60) as http:
                pages = _pages(store)
                for _, page in pages:  # warm-up: first renders load templates and fill the caches
                    http.get(page).raise_for_status()
                for _ in range(repeat):
                    for kind, page in pages:
                        started = time.perf_counter()
                        r = http.get(page)
                        elapsed = time.perf_counter() - started
                        r.raise_for_status()
                        times.setdefault(kind, []).append(elapsed * 1e3)
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            store.close()
    return times


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: dict[str, dict[str, list[float]]], repeat: int, command: str) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    out = ["# Page render time of the exploration pages", "",
           f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.node()}: {os.cpu_count()} CPUs, "
           f"Python {platform.python_version()}; load average at the end {load[0]:.1f} (the machine is shared).",
           f"Command: `{command}`", "",
           f"Every page requested once to warm up, then {repeat} rounds over every page; time from sending the request",
           "to having read the whole body (render + localhost transfer). Target: p95 ≤ 300 ms.", "",
           "| store | page | pages | requests | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|---|---|"]
    for store, times in results.items():
        for kind, values in times.items():
            pages = len(values) // repeat
            out.append(f"| {store} | {kind} | {pages} | {len(values)} | {statistics.median(values):.0f} | "
                       f"{_pct(values, 0.95):.0f} | {max(values):.0f} |")
        every = [v for values in times.values() for v in values]
        out.append(f"| {store} | **all** | | {len(every)} | {statistics.median(every):.0f} | "
                   f"**{_pct(every, 0.95):.0f}** | {max(every):.0f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", type=Path, help="SQLite store files (copied before use)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--output", type=Path, help="write the markdown report here")
    args = parser.parse_args()
    results = {p.name: measure(p, args.repeat) for p in args.stores}
    command = "python benchmarks/ui_render.py " + " ".join(str(p) for p in args.stores) + \
        f" --repeat {args.repeat}" + (f" --output {args.output}" if args.output else "")
    text = report(results, args.repeat, command)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
