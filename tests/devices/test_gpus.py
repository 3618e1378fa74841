"""One worker per GPU, on the CPU: the pinning logic over a stand-in device listing, the supervisor with real
child processes, and the device index and UUID recorded with each measurement."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.recorded import NAME, SHAPES
from tuner import db, registry
from tuner.driver.budget import CountBudget
from tuner.driver.study import open_study
from tuner.driver.trials import run_trials
from tuner.errors import DeviceError
from tuner.measure.devices.gpus import PhysicalGpu, parse_nvidia_smi, pinned_env, visible_gpus
from tuner.measure.devices.replay import Record, ReplayMeasurer
from tuner.service.fleet import WorkerLaunch, plan_fleet, run_fleet

# A stand-in for `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader` on a 4-GPU host.
LISTING = parse_nvidia_smi(
    "0, GPU-aaaa1111-0000-0000-0000-000000000000, NVIDIA H200\n"
    "1, GPU-bbbb2222-0000-0000-0000-000000000000, NVIDIA H200\n"
    "2, GPU-cccc3333-0000-0000-0000-000000000000, NVIDIA H200\n"
    "3, GPU-cccc4444-0000-0000-0000-000000000000, NVIDIA H200\n"
)


def _uuids(environ: dict[str, str]) -> list[str]:
    return [g.physical.uuid[4:8] for g in visible_gpus(LISTING, environ)]


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    assert _uuids({}) == ["aaaa", "bbbb", "cccc", "cccc"]
    assert _uuids({"CUDA_VISIBLE_DEVICES": "2,0"}) == ["cccc", "aaaa"]
    assert [g.ordinal for g in visible_gpus(LISTING, {"CUDA_VISIBLE_DEVICES": "2,0"})] == [0, 1]
    assert _uuids({"CUDA_VISIBLE_DEVICES": "GPU-bbbb2222,3"}) == ["bbbb", "cccc"]
    assert _uuids({"CUDA_VISIBLE_DEVICES": "bbbb,aaaa"}) == ["bbbb", "aaaa"]  # UUID prefixes without GPU-
    # CUDA stops at the first entry that names no GPU: out of range, unknown, ambiguous, repeated, empty.
    assert _uuids({"CUDA_VISIBLE_DEVICES": "1,7,0"}) == ["bbbb"]
    assert _uuids({"CUDA_VISIBLE_DEVICES": "1,GPU-cccc,0"}) == ["bbbb"]
    assert _uuids({"CUDA_VISIBLE_DEVICES": "1,1"}) == ["bbbb"]
    assert _uuids({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert _uuids({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_each_worker_is_pinned_to_its_gpu_and_registers_its_index() -> None:
    gpus = visible_gpus(LISTING, {"CUDA_VISIBLE_DEVICES": "3,1"})
    launches = plan_fleet(gpus, ["--backends", "triton"], {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "3,1"})
    assert [launch.env["CUDA_VISIBLE_DEVICES"] for launch in launches] == [LISTING[3].uuid, LISTING[1].uuid]
    assert all(launch.env["PATH"] == "/bin" for launch in launches)
    for ordinal, launch in enumerate(launches):
        argv = list(launch.argv)
        assert argv[1:4] == ["-m", "tuner.cli", "worker"]
        # Inside its pinned process the GPU is cuda:0; it registers the index this host gives it.
        assert argv[argv.index("--index") + 1] == "0" and argv[argv.index("--registered-index") + 1] == str(ordinal)
        assert argv[-2:] == ["--backends", "triton"]
    assert pinned_env(gpus[0]) == {"CUDA_VISIBLE_DEVICES": LISTING[3].uuid}
    with pytest.raises(DeviceError, match="no GPU is visible"):
        plan_fleet([], [], {})
    with pytest.raises(DeviceError, match="unexpected nvidia-smi line"):
        parse_nvidia_smi("No devices were found\n")


def test_the_supervisor_starts_pinned_children_and_stops_them(tmp_path: Path) -> None:
    """run_fleet with stand-in children (Python printing what they were given): each gets its GPU alone;
    a stop request reaches children that would otherwise run on."""
    script = ("import json, os, sys, time; json.dump({'visible': os.environ['CUDA_VISIBLE_DEVICES'], "
              "'argv': sys.argv[1:]}, open(sys.argv[1], 'w')); time.sleep(float(sys.argv[2]))")
    gpus = visible_gpus(LISTING, {"CUDA_VISIBLE_DEVICES": "0,2"})
    launches = [WorkerLaunch(g, (sys.executable, "-c", script, str(tmp_path / f"{g.ordinal}.json"), "0"),
                             {**pinned_env(g)}) for g in gpus]
    assert run_fleet(launches, threading.Event()) == 0
    seen = [json.loads((tmp_path / f"{g.ordinal}.json").read_text())["visible"] for g in gpus]
    assert seen == [LISTING[0].uuid, LISTING[2].uuid]

    stop = threading.Event()
    sleepers = [dataclasses.replace(launch, argv=(*launch.argv[:-1], "600")) for launch in launches]
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    code = run_fleet(sleepers, stop, grace_s=30)
    assert time.monotonic() - started < 30 and code != 0  # terminated by SIGTERM


def test_measurements_record_the_device_index_and_uuid(recorded_sweep: str, tmp_path: Path) -> None:
    """Two devices of one model share a study (the key names the model); each measurement says which ran it."""
    registry.register(NAME, TUNABLE_REF)
    record = Record.load(db.Store.open(recorded_sweep, migrate_schema=False), NAME)
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    studies = set()
    for index, gpu in enumerate(LISTING[:2]):
        fingerprint = dataclasses.replace(record.fingerprint, info={**record.fingerprint.info, "uuid": gpu.uuid})
        measurer = ReplayMeasurer(dataclasses.replace(record, fingerprint=fingerprint))
        ctx = open_study(NAME, SHAPES[0], store=store, measurer=measurer, sampler="random", seed=index,
                         device_index=index)
        run_trials(ctx, CountBudget(2))
        studies.add(ctx.study_id)
    (study_id,) = studies
    with store.session() as session:
        rows = db.list_measurements(session, study_id=study_id, role="trial")
    assert {(r.device_index, r.device_uuid) for r in rows} == {(0, LISTING[0].uuid), (1, LISTING[1].uuid)}


def test_listing_without_nvidia_smi_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.measure.devices import gpus

    monkeypatch.setattr(gpus, "NVIDIA_SMI_QUERY", ("/nonexistent/nvidia-smi",))
    with pytest.raises(DeviceError, match="cannot list the GPUs"):
        gpus.list_nvidia_gpus()
    assert isinstance(LISTING[0], PhysicalGpu)
