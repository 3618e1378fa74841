"""Shapes nobody tuned, served as the service serves them, timed against mamba_ssm as users call it.

Issue 16 asks what a user gets for a shape outside the five workloads: other model sizes (heads), batch sizes,
sequence lengths and ``dt_out`` dtypes. SHAPES below is that set, fixed here and committed. Part of it is tuned
(``role = "tune"``: ``tuner tune`` in the store first, so those shapes are ``exact``); the rest (``"serve"``)
is never tuned: each gets what a real server answers for it (``tuner serve --no-worker`` on the store, asked
through the runtime client, ``nearest`` or ``default``).

Then every shape is measured in one process, candidates interleaved under the measurement contract (L2
flushed before each sample, CUPTI device time, median of ``--samples``): the served config, the template's
default, mamba_ssm's wrapper as users call it (its autotuner, its fp32 outputs) and its kernel at each fixed
BLOCK_SIZE_H on its own outputs (the strongest of them is the line the ratio is taken against), and the
elementwise kernels moving the template's bytes (the measured ceiling). Served and default configs are
compiled in parallel first (TileLang compiles take seconds each).

usage (GPU machine, the project's bundle on PYTHONPATH):
  python benchmarks/unseen_shapes.py tune-args                  # the -s options of the shapes to tune
  python benchmarks/unseen_shapes.py measure --db URL --json OUT.json --md OUT.md [--samples 100]
  python benchmarks/unseen_shapes.py render OUT.json            # the markdown table again, from the JSON
  python benchmarks/unseen_shapes.py answers OUT.json --db URL  # today's lookup (export file, offline: the same
                                                                # code as the server) against what was measured
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TEMPLATE = "mamba2_chunk_cumsum_tilelang"
# Mamba2 model sizes by heads (headdim 64): 130m 24, 370m 32, 780m 48, 1.3b 64, 2.7b 80, 8b-class 128.
SHAPES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tune", "130m-b16-s2k-bf16", {"B": 16, "S": 2048, "H": 24, "has_bias": True, "dtype": "bfloat16"}),
    ("tune", "370m-b4-s8k-fp16", {"B": 4, "S": 8192, "H": 32, "has_bias": True, "dtype": "float16"}),
    ("tune", "2p7b-b1-s8k-bf16", {"B": 1, "S": 8192, "H": 80, "has_bias": True, "dtype": "bfloat16"}),
    ("tune", "h128-b1-s16k-bf16", {"B": 1, "S": 16384, "H": 128, "has_bias": True, "dtype": "bfloat16"}),
    # Added 2026-12-04 (twenty-sixth session, no device): the first latency-bound shape of the tuned part (24
    # CTAs at block_h 8). 130m-b1-s1k, the one shape under 1.1x in three runs (12 CTAs), was served a config
    # tuned on 96-CTA and larger grids; this shape is one doubling from it. Not yet tuned nor measured.
    ("tune", "130m-b1-s2k-fp16", {"B": 1, "S": 2048, "H": 24, "has_bias": True, "dtype": "float16"}),
    ("serve", "130m-b8-s4k-fp16-nobias", {"B": 8, "S": 4096, "H": 24, "has_bias": False, "dtype": "float16"}),
    ("serve", "130m-b1-s1k-fp16", {"B": 1, "S": 1024, "H": 24, "has_bias": True, "dtype": "float16"}),
    ("serve", "370m-b2-s16k-bf16", {"B": 2, "S": 16384, "H": 32, "has_bias": True, "dtype": "bfloat16"}),
    ("serve", "780m-b4-s8k-bf16", {"B": 4, "S": 8192, "H": 48, "has_bias": True, "dtype": "bfloat16"}),
    ("serve", "780m-b2-s4k-fp32", {"B": 2, "S": 4096, "H": 48, "has_bias": True, "dtype": "float32"}),
    ("serve", "1p3b-b1-s32k-fp16", {"B": 1, "S": 32768, "H": 64, "has_bias": True, "dtype": "float16"}),
    ("serve", "1p3b-b16-s1k-fp32", {"B": 16, "S": 1024, "H": 64, "has_bias": True, "dtype": "float32"}),
    ("serve", "2p7b-b4-s4k-bf16", {"B": 4, "S": 4096, "H": 80, "has_bias": True, "dtype": "bfloat16"}),
    ("serve", "2p7b-b1-s64k-fp16", {"B": 1, "S": 65536, "H": 80, "has_bias": True, "dtype": "float16"}),
    ("serve", "h128-b2-s8k-bf16-nobias", {"B": 2, "S": 8192, "H": 128, "has_bias": False, "dtype": "bfloat16"}),
)
USER_LINES = ("mamba_ssm-wrapper", *tuple(f"mamba_ssm-fp32-bh{n}" for n in (1, 2, 4, 8, 16)))
CEILINGS = tuple(f"ceiling-block{n}" for n in (512, 1024, 2048, 4096))


def shape_text(dims: dict[str, Any]) -> str:
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in dims.items())


def tune_args() -> None:
    print(" ".join(f"-s {shape_text(d)}" for role, _, d in SHAPES if role == "tune"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_answers(db: str) -> list[dict[str, Any]]:
    """Ask a real server (``tuner serve --no-worker`` on ``db``) through the runtime client, per shape."""
    from tuner.service.client import Client

    port = _free_port()
    env = {**os.environ, "TUNER_REVERIFY_FOREIGN": "0"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "serve",
            "--no-worker",
            "--no-reverify",
            "--db",
            db,
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
    )
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("error: the server did not become ready")
            time.sleep(0.5)
        client = Client(f"http://127.0.0.1:{port}", ttl_s=0)
        out = []
        for role, name, dims in SHAPES:
            best = client.best(TEMPLATE, dims, device="cuda")
            out.append(
                {
                    "role": role,
                    "name": name,
                    "dims": dims,
                    "match": best.match,
                    "config": dict(best.config),
                    "distance": best.distance,
                    "source_shape": dict(best.source_shape or {}) or None,
                    "stored_us": best.median_us,
                    "source": best.source,
                    "differences": [str(d) for d in best.differences],
                }
            )
        return out
    finally:
        server.terminate()
        server.wait(30)


def measure(db: str, samples: int, json_path: Path, md_path: Path | None) -> None:
    from tuner import registry
    from tuner.frozen import Config
    from tuner.measure.compile_cache import precompile
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.measurer import Candidate, MeasureOptions, Measurer

    answers = served_answers(db)
    template = registry.get(TEMPLATE)
    ref = registry.ref_of(TEMPLATE)
    default = template.space().default
    jobs = []
    for a in answers:
        shape = template.make_shape(a["dims"])
        a["shape"] = shape
        jobs.append((shape, [Config(a["config"]), default]))
    started = time.monotonic()
    with cf.ThreadPoolExecutor(8) as pool:  # 8 × 2 spawned compile processes
        errors = list(pool.map(lambda job: precompile(template, job[1], job[0], workers=2), jobs))
    print(f"compiled in {time.monotonic() - started:.0f} s", flush=True)
    rows = []
    with Measurer(DeviceSpec("cuda"), MeasureOptions(n_samples=samples)) as measurer:
        fingerprint = measurer.fingerprint()
        for a, (shape, configs), errs in zip(answers, jobs, errors, strict=True):
            labelled = [("served", Candidate(config=configs[0])), ("default", Candidate(config=configs[1]))]
            labelled += [(n, Candidate(comparator=n)) for n in USER_LINES + CEILINGS]
            results = measurer.measure_interleaved(ref, shape, [c for _, c in labelled])
            figures = {
                label: (r.median_us if r.status.value == "OK" else None)
                for (label, _), r in zip(labelled, results, strict=True)
            }
            reasons = {
                label: (r.reason or "").splitlines()[0][:160]
                for (label, _), r in zip(labelled, results, strict=True)
                if r.status.value != "OK"
            }
            row = {k: v for k, v in a.items() if k != "shape"}
            row.update(
                figures=figures, reasons=reasons, compile_errors={str(k.to_dict()): v for k, v in errs.items() if v}
            )
            rows.append(row)
            print(_line(row), flush=True)
    doc = {
        "template": TEMPLATE,
        "version": template.version,
        "samples": samples,
        "db": db,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "fingerprint": json.loads(fingerprint.to_json()),
        "rows": rows,
    }
    json_path.write_text(json.dumps(doc, indent=1, default=str))
    if md_path is not None:
        md_path.write_text(render(doc))
    print(render(doc))


def _user_best(figures: dict[str, float | None]) -> tuple[str | None, float | None]:
    found = [(v, k) for k, v in figures.items() if k in USER_LINES and v is not None]
    if not found:
        return None, None
    v, k = min(found)
    return k, v


def _line(row: dict[str, Any]) -> str:
    f = row["figures"]
    line, user = _user_best(f)
    served = f.get("served")
    ratio = user / served if user and served else None
    return (
        f"{row['name']:26s} {row['match']:8s} served {served} default {f.get('default')} user-best {user} ({line}) "
        f"ratio {ratio and round(ratio, 3)}"
    )


def _fmt(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def render(doc: dict[str, Any]) -> str:
    out = [
        f"Template `{doc['template']}` version {doc['version']}, {doc['samples']} samples per candidate, "
        f"{doc['date']}, device {doc['fingerprint'].get('device_name')}.",
        "",
        "| shape | dims | planned role | answer (from) | served µs | default µs | mamba_ssm as users call it, "
        "best line µs | speedup: that line / served | % of elementwise kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {}  # by the answer's match (exact: tuned; nearest; default)
    for row in doc["rows"]:
        f = row["figures"]
        line, user = _user_best(f)
        served = f.get("served")
        ceiling = min((v for k, v in f.items() if k in CEILINGS and v is not None), default=None)
        ratio = user / served if user and served else None
        if ratio is not None:
            ratios.setdefault(row["match"], []).append(ratio)
        src = row["source_shape"]
        origin = (
            ""
            if not src or row["match"] == "exact"
            else " (" + ",".join(f"{k}={src[k]}" for k in ("B", "S", "H", "has_bias", "dtype") if k in src) + ")"
        )
        out.append(
            f"| {row['name']} | {shape_text({k: row['dims'][k] for k in row['dims']})} | {row['role']} | "
            f"{row['match']}{origin} | {_fmt(served)} | {_fmt(f.get('default'))} | {_fmt(user)} ({line}) | "
            f"{_fmt(ratio, 3)}x | {_fmt(100 * ceiling / served if ceiling and served else None, 0)}% |"
        )
    out.append("")
    for match, values in sorted(ratios.items()):
        if values:
            geo = math.exp(statistics.fmean(math.log(v) for v in values))
            out.append(
                f"- answered **{match}** ({len(values)} shapes): speedup over the strongest mamba_ssm line as users "
                f"call it: min {min(values):.3f}x, geomean {geo:.3f}x; ≥ 1.1x on {sum(v >= 1.1 for v in values)} "
                f"of {len(values)}."
            )
    return "\n".join(out) + "\n"


def answers(doc: dict[str, Any], db_url: str) -> str:
    """What the lookup of this checkout answers for each shape of ``doc`` (a measured run), over the store
    ``db_url`` through its export document and the offline client (the same lookup as the server), and
    whether that config was measured in the run."""
    from tuner import db as tuner_db
    from tuner.service.client import Client, ExportFile
    from tuner.service.export import build_export

    store = tuner_db.Store.open(db_url)
    try:
        document = build_export(store, templates=[TEMPLATE], device_kind="cuda")
    finally:
        store.close()
    client = Client(None, ttl_s=0, file=ExportFile(document, db_url), software=None)
    from tuner import registry

    default = registry.get(TEMPLATE).space().default.to_dict()  # the config the "default" figure timed
    out = [
        "| shape | answered then | answered now | config now was measured as | speedup now |",
        "|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        now = client.best(TEMPLATE, row["dims"], device="cuda", device_name=doc["fingerprint"].get("device_name"))
        f = row["figures"]
        _, user = _user_best(f)
        measured = ("served" if dict(now.config) == row["config"]
                    else "default" if now.match == "default" or dict(now.config) == default else None)
        served = f.get(measured) if measured else None
        speedup = user / served if user and served else None
        out.append(
            f"| {row['name']} | {row['match']} | {now.match} | {measured or 'not measured'} | {_fmt(speedup, 3)}x |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tune-args")
    m = sub.add_parser("measure")
    m.add_argument("--db", required=True)
    m.add_argument("--samples", type=int, default=100)
    m.add_argument("--json", type=Path, required=True)
    m.add_argument("--md", type=Path)
    r = sub.add_parser("render")
    r.add_argument("json", type=Path)
    a = sub.add_parser("answers")
    a.add_argument("json", type=Path)
    a.add_argument("--db", required=True)
    args = ap.parse_args()
    if args.cmd == "tune-args":
        tune_args()
    elif args.cmd == "measure":
        measure(args.db, args.samples, args.json, args.md)
    elif args.cmd == "answers":
        print(answers(json.loads(args.json.read_text()), args.db))
    else:
        print(render(json.loads(args.json.read_text())))


if __name__ == "__main__":
    main()
