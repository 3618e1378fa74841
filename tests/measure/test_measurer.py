"""The Measurer end to end on the CPU backend (Triton interpreter), with real injected faults.

Each fault comes from a real kernel or wrapper of ``tests/fixtures/fault_templates.py``: a frontend compile
error, an exception at launch, a segfault, an abort, a kernel loop that never ends, wrong values, an output
left unwritten. After each, the same measurer must go on measuring.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.fault_templates import (
    CONTRACTS_REF,
    NEAR_BOUND_REF,
    NEAR_RTOL,
    REF,
    input_fraction,
)
from tuner import registry
from tuner.errors import MeasureSetupError, UserInputError
from tuner.frozen import Config, Shape
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import Candidate, MeasureOptions, Measurer, NearBoundChecks
from tuner.results import MeasureResult, Status, Timer

SHAPE = Shape(n=1024)
OPTIONS = MeasureOptions(n_samples=5, warmup=1, timeout_s=30.0)


def cfg(mode: str, block: int = 256) -> Candidate:
    return Candidate(Config(mode=mode, BLOCK=block))


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    with Measurer(DeviceSpec("cpu"), OPTIONS) as m:
        yield m


def assert_ok(result: MeasureResult, n_samples: int = OPTIONS.n_samples) -> None:
    assert result.status is Status.OK, result.reason
    assert result.summary is not None and result.summary.n == n_samples
    s = result.summary
    assert 0 < s.min_us <= s.p20_us <= s.median_us <= s.p80_us <= s.max_us
    assert result.timer is Timer.CPU_WALL
    assert result.errors == {"y": 0.0}
    assert result.reason is None
    assert result.phases.build_s > 0 and result.phases.verify_s > 0 and result.phases.measure_s > 0


def test_ok_config_is_verified_and_timed(measurer: Measurer) -> None:
    result = measurer.measure(REF, SHAPE, cfg("ok"))
    assert_ok(result)
    assert result.config == Config(mode="ok", BLOCK=256)


def test_frontend_compile_error(measurer: Measurer) -> None:
    result = measurer.measure(REF, SHAPE, cfg("compile_error"))
    assert result.status is Status.COMPILE_ERROR
    assert "power of 2" in (result.reason or "")
    assert result.summary is None


def test_build_exception_is_a_compile_error(measurer: Measurer) -> None:
    result = measurer.measure(REF, SHAPE, cfg("build_error"))
    assert result.status is Status.COMPILE_ERROR
    assert "injected build failure" in (result.reason or "")


def test_exception_at_launch_is_a_runtime_error(measurer: Measurer) -> None:
    result = measurer.measure(REF, SHAPE, cfg("raise"))
    assert result.status is Status.RUNTIME_ERROR
    assert (result.reason or "").startswith("RuntimeError: injected launch failure")


def test_wrong_values(measurer: Measurer) -> None:
    result = measurer.measure(REF, SHAPE, cfg("wrong"))
    assert result.status is Status.WRONG_RESULT
    assert 1e-3 < result.errors["y"] < math.inf
    assert "'y'" in (result.reason or "") and "seed 0" in (result.reason or "")


@pytest.mark.parametrize("mode", ["unwritten", "nan"])
def test_nan_left_in_an_output_is_wrong(measurer: Measurer, mode: str) -> None:
    result = measurer.measure(REF, SHAPE, cfg(mode))
    assert result.status is Status.WRONG_RESULT
    assert result.errors["y"] == math.inf


@pytest.mark.parametrize(
    ("mode", "signal", "frame"), [("segfault", "SIGSEGV", "_segfault"), ("abort", "SIGABRT", "run")]
)
def test_a_crash_is_a_runtime_error_and_the_pool_goes_on(
    measurer: Measurer, mode: str, signal: str, frame: str
) -> None:
    result = measurer.measure(REF, SHAPE, cfg(mode))
    assert result.status is Status.RUNTIME_ERROR
    reason = result.reason or ""
    assert f"killed by {signal}" in reason and "building or verifying" in reason
    assert f"in {frame}" in reason  # faulthandler's stack of the dead worker
    assert_ok(measurer.measure(REF, SHAPE, cfg("ok")))


def test_a_hang_times_out_and_the_pool_goes_on() -> None:
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=3, warmup=0, timeout_s=4.0)) as m:
        m.fingerprint()  # the worker is up: the timeout covers the candidate only
        start = time.monotonic()
        result = m.measure(REF, SHAPE, cfg("hang"))
        assert result.status is Status.TIMEOUT
        assert time.monotonic() - start < 15
        assert "within 4 s" in (result.reason or "")
        assert_ok(m.measure(REF, SHAPE, cfg("ok")), n_samples=3)


def test_interleaved_keeps_every_result_around_failures(measurer: Measurer) -> None:
    candidates = [cfg("ok"), cfg("wrong"), Candidate(comparator="torch"), Candidate(comparator="missing"),
                  cfg("ok", block=128)]
    results = measurer.measure_interleaved(REF, SHAPE, candidates, seed=7)
    expected = [Status.OK, Status.WRONG_RESULT, Status.OK, Status.INVALID, Status.OK]
    assert [r.status for r in results] == expected
    assert_ok(results[0])
    assert_ok(results[2])
    assert_ok(results[4])
    assert results[2].config == Config(comparator="torch")
    assert results[3].reason == "unavailable: library fastscale is not installed"
    assert "seed 7" in (results[1].reason or "")


def test_interleaved_survives_a_crash_in_the_middle(measurer: Measurer) -> None:
    results = measurer.measure_interleaved(REF, SHAPE, [cfg("ok"), cfg("segfault"), cfg("ok", block=512)])
    assert [r.status for r in results] == [Status.OK, Status.RUNTIME_ERROR, Status.OK]
    assert "SIGSEGV" in (results[1].reason or "")
    assert_ok(results[0])
    assert_ok(results[2])


def test_interleaved_finds_the_candidate_that_crashes_while_timing(measurer: Measurer) -> None:
    candidates = [cfg("ok"), cfg("segfault_late"), Candidate(comparator="torch")]
    results = measurer.measure_interleaved(REF, SHAPE, candidates)
    assert [r.status for r in results] == [Status.OK, Status.RUNTIME_ERROR, Status.OK]
    assert "while timing it" in (results[1].reason or "")


def test_fingerprint_comes_from_the_worker(measurer: Measurer) -> None:
    fp = measurer.fingerprint()
    assert fp.kind == "cpu" and fp.runtime == "triton-interpreter"
    assert {"python", "torch", "triton"} <= set(fp.libraries)
    assert measurer.fingerprint() is fp


@pytest.fixture
def registered() -> Iterator[str]:
    """``fault_vector_scale`` (no search-space file) registered for one test only: left registered, it would
    be listed by every later test's API."""
    registry.register("fault_vector_scale", REF)
    yield "fault_vector_scale"
    registry.unregister("fault_vector_scale")


def test_registered_name_and_check_seeds(registered: str) -> None:
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=2, warmup=0, check_seeds=3)) as m:
        assert_ok(m.measure(registered, SHAPE, cfg("ok")), n_samples=2)
        result = m.measure(registered, SHAPE, cfg("wrong"), seed=11)
        assert result.status is Status.WRONG_RESULT and "seed 11" in (result.reason or "")


def test_errors_outside_candidates_raise(measurer: Measurer) -> None:
    with pytest.raises(MeasureSetupError, match="no comparator 'nope'"):
        measurer.measure(REF, SHAPE, Candidate(comparator="nope"))
    with pytest.raises(MeasureSetupError, match="cannot load template"):
        measurer.measure("tests.fixtures.fault_templates:NoSuchTemplate", SHAPE, cfg("ok"))
    assert_ok(measurer.measure(REF, SHAPE, cfg("ok")))


def test_warm_overhead_outside_phases(measurer: Measurer) -> None:
    measurer.measure(REF, SHAPE, cfg("ok"))  # the worker is warm and Triton has seen the kernel
    overheads = []
    for _ in range(3):
        start = time.perf_counter()
        result = measurer.measure(REF, SHAPE, cfg("ok"))
        wall = time.perf_counter() - start
        phases = result.phases
        overheads.append(wall - phases.build_s - phases.verify_s - phases.measure_s)
    # target 50 ms; the bound leaves room for a loaded 2-core test machine
    assert min(overheads) < 0.1, overheads


def test_candidate_and_options_validation() -> None:
    with pytest.raises(UserInputError):
        Candidate()
    with pytest.raises(UserInputError):
        Candidate(Config(mode="ok"), "torch")
    assert Candidate(comparator="torch").label == "comparator:torch"
    assert cfg("ok").label == "BLOCK=256,mode=ok"
    with pytest.raises(UserInputError):
        MeasureOptions(n_samples=0)
    with pytest.raises(UserInputError):
        MeasureOptions(timeout_s=0)


def test_an_ungated_comparator_is_timed_with_its_errors(measurer: Measurer) -> None:
    from tests.fixtures.fault_templates import BASELINES_REF

    gated, ungated = measurer.measure_interleaved(
        BASELINES_REF, SHAPE, [Candidate(comparator="gated"), Candidate(comparator="ungated")])
    assert gated.status is Status.WRONG_RESULT and gated.summary is None
    assert ungated.status is Status.OK, ungated.reason
    assert ungated.summary is not None and ungated.summary.n == OPTIONS.n_samples
    assert ungated.errors["y"] > 1e-3  # its error is stored with its time


def test_comparators_run_on_their_own_contract_and_may_return_their_outputs(measurer: Measurer) -> None:
    """A comparator with a contract is built, checked and timed on its contract's shape; one that returns its
    outputs (a library wrapper allocating its own) is checked on what it returned, wrong values included."""
    double, wrapper, wrong = measurer.measure_interleaved(
        CONTRACTS_REF, SHAPE, [Candidate(comparator="double"), Candidate(comparator="wrapper"),
                               Candidate(comparator="wrapper-wrong")])
    assert_ok(double)
    assert_ok(wrapper)
    assert wrong.status is Status.WRONG_RESULT and wrong.errors["y"] > 1e-3


# -- extra input sets for a candidate near its error bound (NearBoundChecks) -----------------------------------
NEAR = NearBoundChecks(margin=0.5, extra_seeds=8)


def fraction(mode: str, seed: int) -> float:
    """The error of the near-bound template's ``mode`` on the inputs of ``seed``, as a fraction of its bound."""
    return input_fraction(mode, SHAPE, seed)


def error_fraction(result: MeasureResult) -> float:
    return result.errors["y"] / NEAR_RTOL


def test_a_config_near_its_bound_is_checked_on_more_input_sets_until_one_fails_it(measurer: Measurer) -> None:
    """A config at half its bound or more on its one input set is checked on up to 8 more: it is WRONG_RESULT at
    the first that fails it (that seed in the reason; no later set checked, though a later one is worse), and
    OK with its worst error over all nine when none does. Without NearBoundChecks (a trial) one set decides."""
    near = Candidate(Config(mode="near", BLOCK=256))
    f = {s: fraction("near", s) for s in range(1000)}

    def extra(s: int) -> list[float]:
        return [f[s + k] for k in range(1, 9)]

    def near_and_clear(s: int) -> bool:  # at half its bound or more; no set within the figures' accuracy of it
        return f[s] >= 0.5 and all(abs(x - 1) > 0.002 for x in [f[s], *extra(s)])

    def worse_after_first_wrong(s: int) -> bool:
        wrong = [k for k in range(1, 9) if f[s + k] >= 1]
        return bool(wrong) and any(f[s + k] > f[s + wrong[0]] + 0.01 for k in range(wrong[0] + 1, 9))

    passing = next(s for s in range(990) if near_and_clear(s) and f[s] + 0.05 < max(extra(s)) < 1)
    failing = next(s for s in range(990) if near_and_clear(s) and f[s] < 1 and worse_after_first_wrong(s))
    first_wrong = next(s for s in range(failing + 1, failing + 9) if f[s] >= 1)

    (trial,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=failing)
    assert trial.status is Status.OK and error_fraction(trial) == pytest.approx(f[failing], abs=1e-3)
    (wrong,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=failing, near_bound=NEAR)
    assert wrong.status is Status.WRONG_RESULT and wrong.summary is None
    assert (wrong.reason or "").startswith(f"inputs seed {first_wrong}: output 'y'")
    assert error_fraction(wrong) == pytest.approx(f[first_wrong], abs=1e-3)  # worst so far: it stopped there
    (ok,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=passing, near_bound=NEAR)
    assert ok.status is Status.OK and ok.summary is not None
    assert error_fraction(ok) == pytest.approx(max(extra(passing)), abs=1e-3)  # worst over all nine sets


def test_a_config_far_from_its_bound_is_checked_on_its_usual_input_sets_only(measurer: Measurer) -> None:
    """A config under half its bound pays nothing: its errors are the worst over its ``check_seeds`` sets,
    though the sets that follow would show a larger one."""
    far = Candidate(Config(mode="far", BLOCK=256))
    f = {s: fraction("far", s) for s in range(300)}
    seed = next(s for s in range(290) if max(f[s + k] for k in range(2, 10)) > max(f[s], f[s + 1]) + 0.005)
    (result,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [far], seed=seed, check_seeds=2,
                                             near_bound=NEAR)
    assert result.status is Status.OK
    assert error_fraction(result) == pytest.approx(max(f[seed], f[seed + 1]), abs=1e-4)


def test_a_config_that_passes_every_set_without_the_headroom_asked_is_wrong(measurer: Measurer) -> None:
    """With a headroom under 1 (a final round's), a config that passed its set and the 8 extra ones but came
    within that headroom of its bound on one of them is WRONG_RESULT all the same: the reason names the output,
    how near it came and the seeds checked; its errors are the worst over all nine. One that kept the
    headroom on all nine is OK, and so are the first with the bounds themselves (headroom 1.0) and a gated
    comparator with the first's errors."""
    near = Candidate(Config(mode="near", BLOCK=256))
    f = {s: fraction("near", s) for s in range(400)}

    def nine(s: int) -> list[float]:
        return [f[s + k] for k in range(9)]

    tight = next(s for s in range(390) if f[s] >= 0.5 and 0.975 <= max(nine(s)) < 0.997)
    clear = next(s for s in range(390) if f[s] >= 0.5 and max(nine(s)) < 0.96)
    asked = NearBoundChecks(margin=0.5, extra_seeds=8, headroom=0.97)

    (short,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=tight, near_bound=asked)
    assert short.status is Status.WRONG_RESULT and short.summary is None
    assert (short.reason or "").startswith(f"inputs seeds {tight}-{tight + 8}: output 'y': worst relative error ")
    assert re.search(r"is 0\.9[789]\d of its bound 0\.001; asked: under 0\.97 of it", short.reason or "")
    assert error_fraction(short) == pytest.approx(max(nine(tight)), abs=1e-3)
    (bounds_only,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=tight, near_bound=NEAR)
    assert bounds_only.status is Status.OK and bounds_only.summary is not None
    (kept,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [near], seed=clear, near_bound=asked)
    assert kept.status is Status.OK and error_fraction(kept) == pytest.approx(max(nine(clear)), abs=1e-3)
    # a gated comparator as near its bound is checked on the extra sets but not asked the headroom (it is never
    # published): OK, timed, its worst error over the nine sets recorded
    (library,) = measurer.measure_interleaved(NEAR_BOUND_REF, SHAPE, [Candidate(comparator="near")], seed=tight,
                                              near_bound=asked)
    assert library.status is Status.OK and library.summary is not None
    assert error_fraction(library) == pytest.approx(max(nine(tight)), abs=1e-3)


def test_a_trial_asks_the_final_rounds_headroom_on_its_one_input_set(measurer: Measurer) -> None:
    """TRIAL_NEAR_BOUND: a config within the final round's headroom of its bound on the trial's set is
    WRONG_RESULT (the round could not publish it; the reason names the one seed); one under the headroom, near
    as it may be, is OK and is checked on no other set (its error is that set's, though the next is worse)."""
    from tuner.driver.study import FINAL_NEAR_BOUND, TRIAL_NEAR_BOUND

    assert TRIAL_NEAR_BOUND.headroom == FINAL_NEAR_BOUND.headroom < 1 and TRIAL_NEAR_BOUND.extra_seeds == 0
    near = Candidate(Config(mode="near", BLOCK=256))
    f = {s: fraction("near", s) for s in range(400)}
    tight = next(s for s in range(399) if TRIAL_NEAR_BOUND.headroom + 0.003 <= f[s] < 0.997)
    clear = next(s for s in range(399) if 0.5 <= f[s] < TRIAL_NEAR_BOUND.headroom - 0.01 and f[s + 1] > f[s] + 0.01)
    short = measurer.measure(NEAR_BOUND_REF, SHAPE, near, seed=tight, near_bound=TRIAL_NEAR_BOUND)
    assert short.status is Status.WRONG_RESULT and short.summary is None
    assert (short.reason or "").startswith(f"inputs seed {tight}: output 'y': worst relative error ")
    assert re.search(r"is 0\.9[789]\d of its bound 0\.001; asked: under 0\.97 of it", short.reason or "")
    kept = measurer.measure(NEAR_BOUND_REF, SHAPE, near, seed=clear, near_bound=TRIAL_NEAR_BOUND)
    assert kept.status is Status.OK and kept.summary is not None
    assert error_fraction(kept) == pytest.approx(f[clear], abs=1e-3)  # its own set only


def test_the_headroom_looks_at_positive_bounds_in_their_order() -> None:
    asked = NearBoundChecks(margin=0.5, extra_seeds=1, headroom=0.9)
    bounds = {"exact": 0.0, "a": 1e-3, "b": 1e-2}
    assert asked.short_of({"exact": 5.0, "a": 8.9e-4, "b": 8.9e-3}, bounds) is None
    assert asked.short_of({"a": 9.2e-4, "b": 1e-2}, bounds) == ("a", 9.2e-4, 1e-3)
    assert asked.short_of({"b": 9.5e-3}, bounds) == ("b", 9.5e-3, 1e-2)
    assert NearBoundChecks(margin=0.5, extra_seeds=1).short_of({"a": 1.0}, bounds) is None  # the check's own


@pytest.mark.parametrize("headroom", [0.0, -0.1, 1.01, math.nan])
def test_the_headroom_is_validated(headroom: float) -> None:
    with pytest.raises(UserInputError, match="headroom"):
        NearBoundChecks(margin=0.5, extra_seeds=8, headroom=headroom)


@pytest.mark.parametrize(("margin", "extra_seeds"), [(0.0, 8), (-0.5, 8), (1.5, 8), (math.nan, 8), (0.5, 0),
                                                     (0.5, -1)])
def test_near_bound_checks_are_validated(margin: float, extra_seeds: int) -> None:
    # (0.5, 0): no extra set and the bounds themselves (headroom 1.0) would ask nothing
    with pytest.raises(UserInputError):
        NearBoundChecks(margin=margin, extra_seeds=extra_seeds)
    assert NearBoundChecks(margin=0.97, extra_seeds=0, headroom=0.97).extra_seeds == 0  # the headroom alone


def test_near_bound_checks_are_immutable_options() -> None:
    checks = NearBoundChecks(margin=1.0, extra_seeds=1)
    options = MeasureOptions(near_bound=checks)
    assert MeasureOptions().near_bound is None  # unless asked (a trial asks TRIAL_NEAR_BOUND's headroom)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checks.margin = 0.1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.near_bound = None  # type: ignore[misc]
    assert checks.near({"y": 1e-3}, {"y": 1e-3}) and not checks.near({"y": 0.99e-3}, {"y": 1e-3})
    assert not checks.near({"y": 0.0}, {"y": 0.0})  # a bound of 0 is met exactly or not at all


def test_the_measuring_process_exits_at_once_when_closed_even_if_a_library_holds_it() -> None:
    """A build that leaves behind a thread its process's exit would wait on (on the H200 a `tuner tune` was
    found in the 5 s wait for the measuring process after publishing): closed, the process exits by itself,
    in well under that grace."""
    from tests.fixtures.fault_templates import SlowCompileVectorScale

    ref = f"{SlowCompileVectorScale.__module__}:{SlowCompileVectorScale.__name__}"
    m = Measurer(DeviceSpec("cpu"), OPTIONS)
    try:
        result = m.measure(ref, SHAPE, cfg("exit_hang"))
        assert result.status is Status.OK, result.reason
        proc = m._worker._proc  # type: ignore[union-attr]
    finally:
        started = time.monotonic()
        m.close()
        took = time.monotonic() - started
    assert proc.returncode == 0 and took < 3.0, (proc.returncode, took)  # killed: -9 after 5 s


def test_a_call_says_where_its_time_went(measurer: Measurer) -> None:
    """The parts of a measuring call (a final round's 59-92 s on the H200 were about twice what its candidates'
    stored phases add up to): one request, the builds and checks and the timing each measured, their sum
    within the call's wall time; a candidate that kills the process makes the call send more requests."""
    candidates = [cfg("ok"), cfg("ok", block=128)]
    started = time.monotonic()
    results = measurer.measure_interleaved(REF, SHAPE, candidates)
    wall = time.monotonic() - started
    parts = measurer.last_call_times()
    assert parts is not None and [r.status for r in results] == [Status.OK, Status.OK]
    assert parts.requests == 1 and parts.prepare_s > 0 and parts.timing_s > 0 and parts.load_s >= 0
    assert parts.start_s + parts.load_s + parts.prepare_s + parts.timing_s <= parts.total_s <= wall
    # the candidates' stored phases (timed in the process) fall within the call's builds and checks, up to the
    # pipe's latency: the process starts building as it sends "loaded", the call's clock when it reads that
    assert sum(r.phases.build_s + r.phases.verify_s for r in results) <= parts.prepare_s + 0.05
    assert "builds and checks" in parts.describe() and "requests" not in parts.describe()
    measurer.measure_interleaved(REF, SHAPE, [cfg("ok"), cfg("segfault"), cfg("ok", block=512)])
    again = measurer.last_call_times()
    assert again is not None and again.requests >= 2 and again.start_s > 0  # a fresh process was waited for
    assert f"({again.requests} requests)" in again.describe()
