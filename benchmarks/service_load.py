"""Load benchmark of ``GET /v1/best``: a fixed request rate against a tuner server, latency percentiles.

    python benchmarks/service_load.py --db sqlite:////tmp/bench.db             # starts `tuner serve` itself
    python benchmarks/service_load.py --db postgresql+psycopg://postgres@127.0.0.1:5432/tuner_bench
    python benchmarks/service_load.py --url http://host:8000 --no-seed          # an existing server

The load generator is this process (asyncio, raw HTTP/1.1 keep-alive connections: little client overhead,
so the figures are the server's); the server is a separate process (``tuner serve --no-worker``). The
schedule is open-loop: request i is due at ``t0 + i / rate`` whatever earlier requests do, so a slow server
cannot slow the load down (no coordinated omission). Latency is reported from the send and from the due
time (the latter also counts time waiting for a free connection or behind a late generator).

Seeding (unless ``--no-seed``): best configs of ``mamba2_chunk_cumsum`` on ``cuda:NVIDIA H200`` for a grid of
shapes are published in the store, as workers do. The request mix cycles through exact shapes, shapes between
them (nearest) and a device kind with no config (default). With ``--cache-ttl 0`` the server's caches are
off and every request runs the full lookup (database query + choose). Also measured: the runtime client's
cached ``Client.best`` (timeit), the target of which is 2 µs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEMPLATE = "mamba2_chunk_cumsum"
DEVICE_NAME = "NVIDIA H200"
TOKEN = "bench-token-0123456789"


# -- seeding ---------------------------------------------------------------------------------------------
def seed_shapes() -> list[dict[str, int]]:
    return [{"B": b, "S": s, "H": h} for b in (1, 4) for s in (2048, 8192, 32768) for h in (24, 48, 80, 128)]


def seed(db_url: str) -> int:
    """Publish a best config (the space's default, a valid one) for every seed shape; returns how many."""
    from tuner import db, registry
    from tuner.keys import Fingerprint, StudyKey

    template = registry.get(TEMPLATE)
    config = template.space().default
    fingerprint = Fingerprint(kind="cuda", device_name=DEVICE_NAME, driver="bench", runtime="bench")
    with db.Store.open(db_url) as store:
        for i, raw in enumerate(seed_shapes()):
            shape = template.make_shape(raw)
            key = StudyKey.of(TEMPLATE, template.version, shape, fingerprint)
            with store.session() as session:
                study = db.get_or_create_study(
                    session, name=key.study_name(), template=TEMPLATE, template_version=template.version,
                    shape_key=key.shape_key, shape_json=shape.to_json(), device_kind="cuda", device_name=DEVICE_NAME,
                    fingerprint_hash=key.fingerprint_hash, fingerprint_json=fingerprint.to_json(),
                )
                m = db.add_measurement(
                    session, study_id=study.id, role="final", candidate="config", config_json=config.to_json(),
                    status="OK", median_us=10.0 + i, p20_us=9.5 + i, p80_us=10.5 + i, n_samples=100, timer="cupti",
                )
                db.publish_best(session, study_id=study.id, measurement_id=m.id)
    return len(seed_shapes())


def request_mix() -> list[str]:
    """Paths of the requests, cycled: exact, nearest (between seeded shapes) and default (npu) answers."""
    paths = []
    for raw in seed_shapes():
        paths.append({"template": TEMPLATE, "device": "cuda", "device_name": DEVICE_NAME, **raw})
        paths.append({"template": TEMPLATE, "device": "cuda", **raw, "S": raw["S"] * 2, "H": raw["H"] + 8})
        paths.append({"template": TEMPLATE, "device": "npu", **raw})
    return ["/v1/best?" + urlencode(p) for p in paths]


# -- the server ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db_url: str, port: int, cache_ttl: float, extra_path: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), extra_path])),
           "TUNER_TOKENS": json.dumps({TOKEN: ["submit", "read"]}), "TUNER_BEST_CACHE_TTL_S": str(cache_ttl)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "serve", "--no-worker", "--no-access-log", "--log-level", "warning",
         "--port", str(port), "--db", db_url], env=env, cwd=ROOT,
    )
    wait_healthy(child, port)
    return child


BASELINE_APP = """
import sys, uvicorn
BODY = b'{"match": "exact", "config": {"BLOCK_H": 4}}' * 12
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def start_baseline(port: int, extra_path: str | None) -> subprocess.Popen[bytes]:
    """A bare ASGI app under the same uvicorn: the floor any server on this machine can reach."""
    env = {**os.environ, "PYTHONPATH": extra_path or ""}
    child = subprocess.Popen([sys.executable, "-c", BASELINE_APP, str(port)], env=env)
    wait_healthy(child, port)
    return child


def wait_healthy(child: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if s.recv(100).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.2)
    child.kill()
    raise SystemExit("the server did not start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the load -----------------------------------------------------------------------------------------------
async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def run_load(url: str, paths: list[str], rate: float, duration: float, warmup: float,
                   connections: int, raw: Path | None = None) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [f"GET {p} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() for p in paths]
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    results: list[tuple[float, float, float, int]] = []  # due, sent, done, status
    errors: list[str] = []

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        while (item := await queue.get()) is not None:
            i, due = item
            sent = time.perf_counter()
            try:
                writer.write(requests[i % len(requests)])
                status = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError) as exc:
                errors.append(type(exc).__name__)
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            results.append((due, sent, time.perf_counter(), status))
        writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    total = int(rate * (duration + warmup))
    t0 = time.perf_counter() + 0.2
    for i in range(total):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((i, due))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    measured = [r for r in results if r[0] >= t0 + warmup]
    if raw is not None:  # due time (s from the start of the measurement), latency from the send (ms)
        raw.write_text("".join(f"{due - t0 - warmup:.4f} {(done - sent) * 1e3:.3f}\n" for due, sent, done, _ in
                               measured))
    return summarise(measured, errors, duration, rate)


def summarise(rows: list[tuple[float, float, float, int]], errors: list[str], duration: float,
              rate: float) -> dict[str, object]:
    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1e3

    from_send = sorted(done - sent for _, sent, done, _ in rows)
    from_due = sorted(done - due for due, _, done, _ in rows)
    span = max(r[2] for r in rows) - min(r[0] for r in rows)
    return {
        "target_rps": rate, "achieved_rps": round(len(rows) / span, 1), "requests": len(rows),
        "non_200": sum(1 for r in rows if r[3] != 200), "errors": len(errors),
        "p50_ms": round(pct(from_send, 0.50), 3), "p90_ms": round(pct(from_send, 0.90), 3),
        "p99_ms": round(pct(from_send, 0.99), 3), "p999_ms": round(pct(from_send, 0.999), 3),
        "max_ms": round(from_send[-1] * 1e3, 3), "mean_ms": round(statistics.fmean(from_send) * 1e3, 3),
        "p50_from_due_ms": round(pct(from_due, 0.50), 3), "p99_from_due_ms": round(pct(from_due, 0.99), 3),
    }


# -- the client's cached lookup ---------------------------------------------------------------------------------
def client_lookup_ns(number: int = 200_000) -> dict[str, float]:
    """Best of 5 timeit runs of a cached ``Client.best`` (an export-file client: the hit path is the same)."""
    from tuner.service.client import Client, ExportFile

    section = {"version": "1", "dims": [{"name": d, "kind": "int", "default": None} for d in ("B", "S", "H")],
               "default": {"BLOCK_H": 4}, "constraints": []}
    client = Client(file=ExportFile({"format": "tuner-best-configs", "schema_version": 1,
                                     "templates": {"t": section}, "entries": []}))
    shape = {"B": 1, "S": 4096, "H": 48}
    client.best("t", shape, device="cuda")
    runs = timeit.repeat(lambda: client.best("t", shape, device="cuda"), number=number, repeat=5)
    kwargs_runs = timeit.repeat(lambda: client.best("t", shape, "cuda", "NVIDIA H200"), number=number, repeat=5)
    return {"cached_best_ns": round(min(runs) / number * 1e9, 1),
            "cached_best_with_device_name_ns": round(min(kwargs_runs) / number * 1e9, 1)}


def measure(args: argparse.Namespace) -> dict[str, object]:
    """The load run against ``--url``, or against a server started here (whose CPU time is reported too)."""
    server, url = None, args.url
    if url is None:
        port = free_port()
        if args.baseline:
            server = start_baseline(port, args.extra_path)
        else:
            server = start_server(args.db, port, args.cache_ttl, args.extra_path)
        url = f"http://127.0.0.1:{port}"
    try:
        cpu_before = cpu_seconds(server.pid) if server else 0.0
        started = time.perf_counter()
        figures = asyncio.run(
            run_load(url, request_mix(), args.rate, args.duration, args.warmup, args.connections, args.raw))
        if server:
            cpu = cpu_seconds(server.pid) - cpu_before
            figures["server_cpu_ms_per_request"] = round(cpu * 1e3 / (args.rate * (args.duration + args.warmup)), 3)
            figures["server_cpu_share"] = round(cpu / (time.perf_counter() - started), 2)
    finally:
        if server:
            server.terminate()
            server.wait(timeout=30)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="An existing server (default: start one on --db).")
    parser.add_argument("--db", default="sqlite:////tmp/tuner-bench.db", help="Store of the started server.")
    parser.add_argument("--rate", type=float, default=500.0, help="Requests per second.")
    parser.add_argument("--duration", type=float, default=25.0, help="Measured seconds.")
    parser.add_argument("--warmup", type=float, default=3.0, help="Seconds sent first and not measured.")
    parser.add_argument("--connections", type=int, default=32, help="Keep-alive connections.")
    parser.add_argument("--cache-ttl", type=float, default=1.0, help="TUNER_BEST_CACHE_TTL_S of the server.")
    parser.add_argument("--no-seed", action="store_true", help="Do not publish the seed configs.")
    parser.add_argument("--extra-path", help="Prepended to the server's PYTHONPATH (e.g. uvloop/httptools).")
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    parser.add_argument("--baseline", action="store_true", help="Measure a bare ASGI app instead (the floor).")
    parser.add_argument("--raw", type=Path, help="Write every request's due time and latency to this file.")
    args = parser.parse_args()

    if not args.no_seed and not args.url and not args.baseline:
        print(f"seeded {seed(args.db)} best configs in {args.db.split('@')[-1]}", file=sys.stderr)
    figures = measure(args)
    figures.update(client_lookup_ns())
    server = "url" if args.url else "baseline" if args.baseline else args.db.split("://")[0]
    figures.update({"server": server, "cache_ttl_s": args.cache_ttl,
                    "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2)})
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
