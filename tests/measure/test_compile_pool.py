"""The compile pool under a deadline: a build that never finishes costs its batch one timeout, not the sweep.

Real spawned compile processes and a real study on the CPU backend; the hanging build is the slow-compile
fixture template's ``compile_hang`` config (it sleeps, as a compiler that hangs)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.fault_templates import SLOW_COMPILE_REF, SlowCompileVectorScale
from tuner import db, registry
from tuner.driver.budget import CountBudget
from tuner.driver.study import finalize, open_study, prebuild
from tuner.driver.trials import run_trials
from tuner.errors import MeasureInterrupted
from tuner.frozen import Config, Shape
from tuner.measure.compile_cache import CompileCache, CompilePool
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import Status

NAME = "fault_vector_scale_slow_compile"
HANG = Config(mode="compile_hang", BLOCK=64)


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    registry.register(NAME, SLOW_COMPILE_REF)
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=3, warmup=1, timeout_s=4)) as m:
        yield m


def test_a_build_that_hangs_times_out_and_the_pool_serves_the_next_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    template, shape = SlowCompileVectorScale(), Shape(n=256)
    ok = [Config(mode="ok", BLOCK=b) for b in (16, 32)]
    with CompilePool(3, CompileCache(tmp_path / "cache")) as pool:
        started = time.monotonic()
        # 10 s: the batch's own limit is 2 x 10 s, and three fresh processes importing torch on a loaded
        # 2-core host took more than the 6 s a 3 s limit gave (the hung build was then "unbuilt")
        batch = pool.compile(template, [*ok, HANG], shape, timeout_s=10)
        took = time.monotonic() - started
        assert batch.timed_out == {HANG} and not batch.unbuilt
        assert "timed out after 10 s" in (batch.errors[HANG] or "")
        assert [batch.errors[c] for c in ok] == [None, None]
        assert took < 40  # one round of builds: 10 s, plus the processes' start and kill
        # The killed processes are replaced: the next batch builds.
        again = pool.compile(template, [Config(mode="ok", BLOCK=128)], shape, timeout_s=3)
        assert again.errors == {Config(mode="ok", BLOCK=128): None} and not again.timed_out


def test_closing_a_pool_kills_a_process_whose_exit_hangs(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A build that leaves behind a thread its process's exit waits on: closing the pool (the end of `tuner
    tune`) returns after the grace period with the process killed; before, it waited for the thread (an
    hour here)."""
    import tuner.measure.compile_cache as compile_cache

    monkeypatch.setattr(compile_cache, "CLOSE_GRACE_S", 2.0, raising=False)
    template, shape = SlowCompileVectorScale(), Shape(n=256)
    stuck, ok = Config(mode="exit_hang", BLOCK=16), Config(mode="ok", BLOCK=32)
    pool = CompilePool(2, CompileCache(tmp_path / "cache"))
    batch = pool.compile(template, [stuck, ok], shape, timeout_s=60)
    assert batch.errors == {stuck: None, ok: None} and not batch.timed_out
    processes = list(pool._pool._processes.values())  # type: ignore[union-attr]
    assert len(processes) == 2
    closer = threading.Thread(target=pool.close, daemon=True)
    try:
        closer.start()
        closer.join(20)  # the 2 s grace, then the kill
        assert not closer.is_alive(), "closing the pool waited on a process that does not exit"
        assert not any(p.is_alive() for p in processes)
    finally:
        for p in processes:  # a failed run leaves no process behind
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(p.pid, signal.SIGKILL)
    again = pool.compile(template, [Config(mode="ok", BLOCK=64), Config(mode="ok", BLOCK=128)], shape, timeout_s=60)
    assert set(again.errors.values()) == {None}  # a closed pool starts fresh processes
    pool.close()


def test_a_crash_beside_a_hung_build_still_ends_the_batch_in_its_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A crash fails every build pending in the pool, the hung one too: each is retried alone, under the same
    timeout (before, the hung build's retry had none and the batch never ended)."""
    template, shape = SlowCompileVectorScale(), Shape(n=256)
    crash, ok = Config(mode="compile_crash", BLOCK=16), Config(mode="ok", BLOCK=32)
    with CompilePool(3, CompileCache(tmp_path / "cache")) as pool:
        started = time.monotonic()
        batch = pool.compile(template, [crash, HANG, ok], shape, timeout_s=10)  # 10 s: see the test above
        assert time.monotonic() - started < 120
    assert HANG in batch.timed_out and crash not in batch.timed_out
    assert "crashed the process twice" in (batch.errors[crash] or "")
    assert batch.errors[ok] is None


def test_killing_a_hung_build_kills_the_compiler_it_started(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("TUNER_TEST_CHILD_PID", str(pid_file))
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        batch = pool.compile(SlowCompileVectorScale(), [Config(mode="compile_hang_child", BLOCK=16)], Shape(n=64),
                             timeout_s=3)
    assert batch.timed_out == {Config(mode="compile_hang_child", BLOCK=16)}
    _assert_all_gone(pid_file, 1)


def _children(pid_file: Path) -> list[int]:
    """The pids of the compilers the hung builds started (one line each), oldest first."""
    return [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []


def _assert_all_gone(pid_file: Path, count: int) -> None:
    """``count`` compilers were started and each is dead within 10 s (killed with its build's process group)."""
    children = _children(pid_file)
    assert len(children) == count, children
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if _alive(c)], f"compilers {children} outlived their builds"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def test_without_a_timeout_a_batch_waits_for_every_build(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        batch = pool.compile(SlowCompileVectorScale(), [Config(mode="ok", BLOCK=16)], Shape(n=64))
    assert batch.errors == {Config(mode="ok", BLOCK=16): None} and not batch.timed_out


def test_a_sweep_records_a_hung_build_as_a_timeout_and_goes_on(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    started = time.monotonic()
    with CompilePool(3, CompileCache(tmp_path / "cache")) as pool:
        records = run_trials(ctx, CountBudget(6), batch=3, compile_pool=pool)
    measured = [r for r in records if r.measured]
    assert len(measured) == 6
    hung = [r for r in measured if r.config == HANG]
    assert len(hung) == 1 and hung[0].status is Status.TIMEOUT
    assert "while building (parallel compile)" in (hung[0].reason or "")
    assert all(r.status is Status.OK for r in measured if r.config["mode"] == "ok")
    # The hung build was not started again by the measurer (that would wait for its 4 s timeout, twice).
    assert time.monotonic() - started < 120
    with store.session() as session:
        (row,) = [m for m in db.list_measurements(session, study_id=ctx.study_id, role="trial")
                  if m.config_json == HANG.to_json()]
    assert row.status is Status.TIMEOUT and row.build_s >= 8  # twice the candidate timeout


def test_a_final_round_builds_its_configs_in_the_pool_first(tmp_path, measurer: Measurer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    run_trials(ctx, CountBudget(4))  # built one after another by the measurer
    log = tmp_path / "builds.log"
    monkeypatch.setenv("TUNER_TEST_BUILD_LOG", str(log))  # the pool's processes, spawned below, inherit it
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        final = finalize(ctx, finalists=2, comparators=False, pool=pool)
    configs = {e.result.config for e in final.entries if e.label != "comparator:torch"}
    assert len(configs) >= 2 and all(e.result.ok for e in final.entries) and final.published
    pooled = {Config.from_json(line.split(" ", 1)[1]) for line in log.read_text().splitlines()
              if line.startswith("SpawnProcess")}
    assert pooled == configs  # each of the round's configs, and nothing else, was built in the pool


def test_a_final_round_builds_its_comparators_in_the_pool_too(tmp_path, measurer: Measurer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A library marked ``prebuild`` (it compiles for minutes at its first call: mamba_ssm's TileLang
    backward) is built beside the round's configs, not inside its measurement's timeout; an unavailable one
    is not built and says why; an unmarked one is built by its measurement alone."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    run_trials(ctx, CountBudget(3))
    log = tmp_path / "builds.log"
    monkeypatch.setenv("TUNER_TEST_BUILD_LOG", str(log))
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        final = finalize(ctx, finalists=2, pool=pool)
    entries = {e.label: e.result for e in final.entries}
    assert entries["comparator:torch"].ok and final.published
    assert entries["comparator:missing"].status is Status.INVALID
    assert "fastscale is not installed" in (entries["comparator:missing"].reason or "")
    pooled = [line.split(" ", 1)[1] for line in log.read_text().splitlines() if line.startswith("SpawnProcess")]
    assert pooled.count('{"comparator":"torch"}') == 1 and '{"comparator":"missing"}' not in pooled
    assert entries["comparator:torch_inline"].ok and '{"comparator":"torch_inline"}' not in pooled


def test_a_final_round_comparator_whose_build_hangs_is_a_timeout(tmp_path, measurer: Measurer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    run_trials(ctx, CountBudget(2))
    monkeypatch.setenv("TUNER_TEST_COMPARATOR_HANG", "1")  # in the pool's processes, spawned below
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        final = finalize(ctx, finalists=1, names=["torch"], pool=pool)
    entries = {e.label: e.result for e in final.entries}
    assert entries["comparator:torch"].status is Status.TIMEOUT
    assert "while building" in (entries["comparator:torch"].reason or "")
    assert final.published  # the configs were measured and one published, the hung library aside
    # the round says where its time went: the prebuild waited out the hung build's limit (2 x 4 s)
    assert final.prebuild_s >= 8 and 0 < final.measure_s < final.prebuild_s + 60


def test_a_final_round_config_whose_build_hangs_is_a_timeout(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    ok = Config(mode="ok", BLOCK=64)
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        late = prebuild(ctx, [HANG, ok], pool)
    assert set(late) == {HANG}
    assert late[HANG].status is Status.TIMEOUT and late[HANG].phases.build_s >= 8


def test_a_batch_whose_processes_never_start_a_build_ends_in_its_time(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.fixtures.import_hang import ImportHangVectorScale  # imported here before the variable is set

    monkeypatch.setenv("TUNER_TEST_IMPORT_HANG", "1")  # the pool's processes hang importing the template
    configs = [Config(mode="ok", BLOCK=64), Config(mode="ok", BLOCK=128), Config(mode="ok", BLOCK=256)]
    started = time.monotonic()
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        batch = pool.compile(ImportHangVectorScale(), configs, Shape(n=256), timeout_s=2)
    # Two rounds of two builds, plus one limit for the imports: 3 x 2 s, then the kill.
    assert 6 <= time.monotonic() - started < 60
    assert batch.unbuilt == set(configs) and not batch.timed_out  # never started: not the configs' fault


def test_a_pool_whose_idle_process_died_is_replaced_at_the_next_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ok = [Config(mode="ok", BLOCK=16), Config(mode="ok", BLOCK=32)]
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        assert pool.compile(SlowCompileVectorScale(), ok, Shape(n=256), timeout_s=30).errors == dict.fromkeys(ok)
        assert pool._pool is not None
        os.kill(next(iter(pool._pool._processes.values())).pid, signal.SIGKILL)  # the OOM killer, say
        time.sleep(1.0)
        more = [Config(mode="ok", BLOCK=64), Config(mode="ok", BLOCK=128)]
        assert pool.compile(SlowCompileVectorScale(), more, Shape(n=256), timeout_s=30).errors == dict.fromkeys(more)


def test_an_interrupted_batch_kills_its_builds(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C (or the CLI's stop signal) while a build hangs: the pool's processes and the compilers they
    started are killed, and closing the pool does not wait on the hung build."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("TUNER_TEST_CHILD_PID", str(pid_file))
    main = threading.main_thread().ident or 0
    # Ctrl-C as an interactive Python gets it: a test run started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no handler (this test hung in such a run)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # once the hung build has started its compiler (a fixed 3 s fired before that on a loaded CI host)
        interrupted = _when_started(pid_file, 1, not_before_s=1.0,
                                    act=lambda: signal.pthread_kill(main, signal.SIGINT))
        with pytest.raises(KeyboardInterrupt), CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
            pool.compile(SlowCompileVectorScale(), [Config(mode="compile_hang_child", BLOCK=16)], Shape(n=64),
                         timeout_s=600)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - interrupted[0] < 60
    _assert_all_gone(pid_file, 1)  # the build's own child process (a compiler) went with it


def test_a_pool_interrupted_from_another_thread_ends_its_batch_at_once(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A worker stopping (SIGTERM) interrupts the batch it waits on: the hung build and the compiler it
    started are killed, compile raises MeasureInterrupted within a poll, not after the build's timeout."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("TUNER_TEST_CHILD_PID", str(pid_file))
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        # once the hung build has started its compiler (a fixed 3 s fired before that on a loaded CI host)
        interrupted = _when_started(pid_file, 1, not_before_s=1.0, act=pool.interrupt)
        with pytest.raises(MeasureInterrupted):
            pool.compile(SlowCompileVectorScale(), [Config(mode="compile_hang_child", BLOCK=16),
                                                    Config(mode="ok", BLOCK=32)], Shape(n=64), timeout_s=600)
        assert time.monotonic() - interrupted[0] < 30
        with pytest.raises(MeasureInterrupted):  # a stopping worker's pool builds nothing more
            pool.compile(SlowCompileVectorScale(), [Config(mode="ok", BLOCK=64)], Shape(n=64), timeout_s=600)
    _assert_all_gone(pid_file, 1)


def test_an_interrupt_reaches_the_builds_retried_alone_after_a_crash(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A crash fails every build pending in the pool; each is then built alone in a fresh process. The crash
    kills the compiler the hung build had started in the broken pool (the pool's own SIGTERM reaches its
    processes only), and a worker stopping meanwhile ends the retried builds too (the hung one would wait
    for its whole timeout)."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("TUNER_TEST_CHILD_PID", str(pid_file))
    monkeypatch.setenv("TUNER_TEST_CRASH_AFTER_CHILD", "1")  # the hung build's compiler runs when the pool breaks
    crash, hang = Config(mode="compile_crash", BLOCK=16), Config(mode="compile_hang_child", BLOCK=32)
    with CompilePool(2, CompileCache(tmp_path / "cache")) as pool:
        interrupted = _when_started(pid_file, 2, not_before_s=0.0, act=pool.interrupt)  # the retry's compiler too
        with pytest.raises(MeasureInterrupted):  # (the crash submitted last: it may run in the newest process)
            pool.compile(SlowCompileVectorScale(), [hang, crash], Shape(n=64), timeout_s=600)
        assert time.monotonic() - interrupted[0] < 60
    _assert_all_gone(pid_file, 2)


def _when_started(pid_file: Path, compilers: int, *, not_before_s: float, act: Callable[[], object]) -> list[float]:
    """Call ``act`` from another thread once ``not_before_s`` have passed and the hung builds have started
    ``compilers`` compilers (their pids in ``pid_file``; at most 120 s); the returned list gets its time."""
    at: list[float] = []
    earliest = time.monotonic() + not_before_s

    def run() -> None:
        deadline = time.monotonic() + 120
        while ((time.monotonic() < earliest or len(_children(pid_file)) < compilers)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        at.append(time.monotonic())
        act()

    threading.Thread(target=run, daemon=True).start()
    return at
