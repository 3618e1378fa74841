"""The study driver end to end: real Optuna studies in the store's database, real measurements on the CPU
backend (Triton interpreter), real faults from the fault-injection template."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests.fixtures.fault_templates import TUNABLE_REF
from tuner import db, registry
from tuner.driver.budget import CountBudget, DeadlineBudget
from tuner.driver.study import FinalRound, StudyContext, finalize, open_study, queue_in_order
from tuner.driver.trials import _in_flight_twin, run_trials
from tuner.frozen import Config, Shape
from tuner.keys import StudyKey
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.report.markdown import collect, render_verifications
from tuner.results import COMPARATOR_PREFIX, Status
from tuner.store.records import VERIFIED_LABEL

NAME = "fault_vector_scale_tunable"


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    registry.register(NAME, TUNABLE_REF)
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=5, warmup=1, timeout_s=60)) as m:
        yield m


def test_sweep_records_every_trial_and_publishes_a_verified_best(db_url: str, measurer: Measurer) -> None:
    store = db.Store.open(db_url)
    shape = Shape(n=256)
    ctx = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=3)
    records = run_trials(ctx, CountBudget(14))
    measured = [r for r in records if r.measured]
    assert len(measured) == 14
    # The default config is enqueued first and is correct.
    assert records[0].config == Config(mode="ok", BLOCK=64) and records[0].status is Status.OK
    statuses = {r.status for r in records}
    assert Status.OK in statuses and len(statuses - {Status.OK, Status.INVALID}) >= 2
    for r in records:
        if r.status is Status.INVALID:
            assert "a block larger than the vector" in (r.reason or "")
        if r.status is Status.WRONG_RESULT:
            assert r.config["mode"] in ("wrong", "unwritten", "nan")

    with store.session() as session:
        rows = db.list_measurements(session, study_id=ctx.study_id, role="trial")
    assert len(rows) == sum(1 for r in records if r.duplicate_of is None)
    # Optuna sees the same trials: values for OK, FAIL with a reason otherwise, PRUNED for invalid configs.
    study = optuna.load_study(study_name=ctx.key.study_name(), storage=store.optuna_url)
    by_number = {t.number: t for t in study.trials}
    for r in records:
        t = by_number[r.number]
        assert t.user_attrs["status"] == r.status.value
        if r.status is Status.OK:
            assert t.state is optuna.trial.TrialState.COMPLETE and t.value == pytest.approx(r.median_us)
        elif r.status is Status.INVALID:
            assert t.state is optuna.trial.TrialState.PRUNED
        else:
            assert t.state is optuna.trial.TrialState.FAIL and t.user_attrs["reason"]

    final = finalize(ctx, finalists=2)
    labels = [e.label for e in final.entries]
    assert "comparator:torch" in labels and "comparator:missing" in labels
    assert final.winner is not None and final.winner.result.ok and final.published
    missing = next(e for e in final.entries if e.label == "comparator:missing")
    assert "not installed" in (missing.result.reason or "")
    with store.session() as session:
        best = db.get_best(session, template=NAME, shape_key=shape.key(), device_kind="cpu")
        assert best is not None and best.config["mode"] == "ok"
        assert db.latest_round(session, study_id=ctx.study_id)[0].round_id == final.round_id


def test_reopening_continues_the_same_study_and_skips_known_configs(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    first = open_study(NAME, shape, store=store, measurer=measurer, sampler="grid", seed=0)
    run_trials(first, CountBudget(3))
    again = open_study(NAME, shape, store=store, measurer=measurer, sampler="grid", seed=0)
    assert again.study_id == first.study_id
    records = run_trials(again, CountBudget(1000))
    # The grid has 7 modes x 6 blocks = 42 points, 21 of them valid for n=64; each measured once in all.
    with store.session() as session:
        rows = db.list_measurements(session, study_id=again.study_id, role="trial")
    configs = [r.config_json for r in rows if r.status is not Status.INVALID]
    assert len(configs) == len(set(configs)) == 21
    # Only the enqueued default comes round again (the grid hands its point out once more): not re-measured.
    assert [r.config for r in records if r.duplicate_of is not None] == [Config(mode="ok", BLOCK=64)]


def test_a_seed_left_running_by_a_killed_run_is_measured_on_reopening(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    first = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0)
    orphan = first.study.ask()  # the enqueued default, asked by a run that was then killed (never told)
    assert first.space.suggest(orphan) == Config(mode="ok", BLOCK=64)
    again = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0)
    (record,) = run_trials(again, CountBudget(1))
    assert record.config == Config(mode="ok", BLOCK=64) and record.status is Status.OK
    assert record.duplicate_of is None
    # Measured now, the default is settled: a third opening does not queue it again.
    third = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0)
    waiting = third.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == []


def _queue(study: optuna.Study) -> list[dict[str, object]]:
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return [dict(t.system_attrs["fixed_params"]) for t in waiting]


def test_warm_starts_missing_from_a_resumed_queue_go_ahead_of_it(db_url: str) -> None:
    """A resumed study whose queue holds configs of earlier runs measures the current warm starts first (a
    seed added to the space must not wait behind the old queue), in their order, then the rest."""
    store = db.Store.open(db_url)
    study = optuna.create_study(study_name="q", storage=store.optuna_storage(), direction="minimize")
    a, b, c = {"BLOCK": 16, "mode": "ok"}, {"BLOCK": 32, "mode": "ok"}, {"BLOCK": 64, "mode": "ok"}
    study.enqueue_trial(a)
    study.enqueue_trial(b)
    queue_in_order(study, store, [a, b, c])  # in order already: c is appended, nothing withdrawn
    assert _queue(study) == [a, b, c]
    assert not study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    queue_in_order(study, store, [c, a])  # c first now: the old queue is withdrawn and queued again behind it
    assert _queue(study) == [c, a, b]
    popped = [study.ask().number for _ in range(3)]
    assert [study.trials[n].system_attrs["fixed_params"] for n in popped] == [c, a, b]
    withdrawn = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(withdrawn) == 3 and all("measurement_id" not in t.user_attrs for t in withdrawn)


def test_reordering_the_queue_leaves_a_trial_another_worker_popped(db_url: str) -> None:
    store = db.Store.open(db_url)
    study = optuna.create_study(study_name="q", storage=store.optuna_storage(), direction="minimize")
    a, b = {"BLOCK": 16}, {"BLOCK": 32}
    study.enqueue_trial(a)
    study.enqueue_trial(b)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    # another worker pops a between this worker's read of the queue and its withdrawal
    other = optuna.load_study(study_name="q", storage=store.optuna_storage())
    running = other.ask()
    assert running.params == {} and running._trial_id == waiting[0]._trial_id  # params come with suggest
    assert store.withdraw_waiting_trials([t._trial_id for t in waiting]) == {waiting[1]._trial_id}
    assert study.trials[running.number].state is optuna.trial.TrialState.RUNNING


def test_a_seed_added_to_the_space_runs_before_the_old_queue(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """End to end through open_study: a config an earlier run left queued (before the space had the seeds
    it has now) waits behind the warm starts that were not measured yet."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    template = registry.load(registry.ref_of(NAME))
    key = StudyKey.of(template.name, template.version, shape, measurer.fingerprint())
    earlier = optuna.create_study(study_name=key.study_name(), storage=store.optuna_storage(), direction="minimize")
    stale = {"BLOCK": 32, "mode": "ok"}
    earlier.enqueue_trial(stale)
    ctx = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0)
    default = dict(ctx.space.default.to_dict())
    assert _queue(ctx.study) == [default, stale]
    records = run_trials(ctx, CountBudget(2))
    assert [dict(r.config) for r in records] == [default, stale]


def test_a_trial_orphaned_before_its_first_heartbeat_is_failed(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A worker killed between asking a trial and beating for it leaves a RUNNING trial that Optuna's
    stale-trial check never sees (no heartbeat); the next worker fails it once the grace period is over."""
    import time

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    dead = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0, heartbeat_s=1.0)
    orphan = dead.study.ask()  # no heartbeat, no parameters: the worker died here
    live = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0, heartbeat_s=1.0)
    run_trials(live, CountBudget(1))  # within the grace period: left alone (its worker may be alive)
    assert live.study.trials[orphan.number].state is optuna.trial.TrialState.RUNNING
    time.sleep(4.5)  # the grace period: 4 heartbeat intervals, at least 4 s
    (record,) = run_trials(live, CountBudget(1))
    failed = live.study.trials[orphan.number]
    assert failed.state is optuna.trial.TrialState.FAIL and "orphaned" in failed.user_attrs["reason"]
    # It held the enqueued default: queued again and measured next, so the default is not lost.
    assert record.config == Config(mode="ok", BLOCK=64) and record.number > orphan.number


def test_two_workers_asking_the_same_config_at_once_measure_it_once(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """Two workers sharing a study (heartbeats on) that ask the same config at the same moment (each queued
    the one config the study lacked) both hold a RUNNING trial of it. The later one steps aside as a duplicate
    of the earlier, and the earlier is measured: before, each found the other in flight, both stepped aside,
    and the config counted as settled without a measurement (a CI run's search ended without its only
    correct config)."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=16)
    first = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0, heartbeat_s=1.0)
    second = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=0, heartbeat_s=1.0)
    lacking = Config(mode="ok", BLOCK=16)
    trials = []
    for ctx in (first, second):
        ctx.study.enqueue_trial(lacking.to_dict(), skip_if_exists=False)
    for ctx in (first, second):  # both asked before either looked for a twin
        trial = ctx.study.ask()
        while ctx.space.suggest(trial) != lacking:  # the default queued on opening comes first
            ctx.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            trial = ctx.study.ask()
        trials.append(trial)
    early, late = sorted(trials, key=lambda t: t.number)
    assert _in_flight_twin(first, early.number, lacking) is None  # the earlier one is measured
    assert _in_flight_twin(second, late.number, lacking) == early.number  # the later one steps aside
    # A config queued long ago (a low number) and asked after another worker's fresh trial of it started: the
    # queued one steps aside (asked later), so the config is not measured twice.
    again = Config(mode="wrong", BLOCK=16)
    first.study.enqueue_trial(again.to_dict(), skip_if_exists=False)
    queued_number = max(t.number for t in first.study.get_trials(deepcopy=False))
    fresh = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params=again.to_dict(),
                                      distributions=first.study.trials[early.number].distributions)
    second.study.add_trial(fresh)
    fresh_number = max(t.number for t in second.study.get_trials(deepcopy=False))
    popped = first.study.ask()
    assert popped.number == queued_number < fresh_number and first.space.suggest(popped) == again
    assert _in_flight_twin(first, queued_number, again) == fresh_number
    assert _in_flight_twin(second, fresh_number, again) is None


def test_in_a_batch_a_trials_overhead_leaves_out_its_wait(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """Trials asked together are measured one after another: the last one's wall time holds the others'
    measurements, its overhead (what the tuner itself costs per trial) does not."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=5)
    records = [r for r in run_trials(ctx, CountBudget(4), batch=4) if r.measured]
    assert len(records) == 4
    last = records[-1]
    with store.session() as session:
        rows = db.list_measurements(session, study_id=ctx.study_id, role="trial")
    phases = sum(r.build_s + r.verify_s + r.measure_s for r in rows)
    assert len(rows) == 4
    # Its wall time holds the four measurements (the three before it were its wait); its overhead holds
    # none of them.
    assert last.wall_s - last.overhead_s >= phases


def test_a_study_with_no_passing_config_publishes_nothing(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=8), store=store, measurer=measurer)  # every BLOCK > n: all invalid
    records = run_trials(ctx, CountBudget(5), max_skips=20)
    assert len(records) == 20 and all(r.status is Status.INVALID for r in records)
    final = finalize(ctx, comparators=False)
    assert final.winner is None and not final.published


def test_a_round_whose_job_was_cancelled_meanwhile_is_stored_not_published(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=5)
    run_trials(ctx, CountBudget(3))
    asked: list[bool] = []
    final = finalize(ctx, finalists=1, comparators=False, may_publish=lambda: asked.append(True) or False)
    assert asked == [True] and final.winner is not None and not final.published
    assert store.get_study_best(study_id=ctx.study_id) is None  # nothing served from a cancelled job
    assert store.latest_round(study_id=ctx.study_id)  # the round's measurements are kept
    # the report shows the round's winner, but not as a served best waiting for `tuner verify`
    report = collect(store, NAME)
    (row,) = report.rows
    assert row.best_us is not None and not row.published
    assert "not yet re-measured" not in render_verifications([report])


def test_a_rounds_writes_whose_answers_are_lost_are_retried_and_stored_once(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A worker runs a final round's writes through its retries (``persist``): each write here goes through
    and then its answer is lost (the commit happened, the caller got a StoreError), and is run again. The
    round keeps one row per candidate and publishes its winner; before, one dropped connection lost a round
    that takes minutes to measure on the MIMO template."""
    from tuner.errors import StoreError

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=5)
    run_trials(ctx, CountBudget(4))
    tries: list[int] = []

    def answer_lost_once(write):  # type: ignore[no-untyped-def]
        tries.append(1)
        write()
        try:
            raise StoreError("the connection dropped before the commit's answer")
        except StoreError:
            return write()  # the retry of tuner.db.retry.durable

    asked: list[bool] = []
    final = finalize(ctx, finalists=2, comparators=True, persist=answer_lost_once,
                     may_publish=lambda: asked.append(True) or True)
    rows = store.list_measurements(study_id=ctx.study_id, role="final")
    assert len(rows) == len(final.entries) == len({(r.candidate, r.config_json) for r in rows})
    assert [e.measurement_id for e in final.entries] == [r.id for r in rows]
    # one try per row, one for the read of the disproved configs, one for may_publish (a worker's asks the
    # store whether the job is still active), one per publish tried, one for the round's description (Optuna's
    # study attributes, written again on the retry)
    assert len(tries) == len(rows) + 1 + 1 + 1 + 1 and asked == [True, True]
    best = store.get_study_best(study_id=ctx.study_id)
    assert final.published and final.winner is not None and best is not None
    assert best.measurement_id == final.winner.measurement_id


def test_a_round_whose_worker_lost_its_hold_does_not_publish(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """The worker measuring a final round was declared lost and the round handed to another, which published
    its own: the first worker's publish, with its hold, is refused (SlotLostError) and the best stays."""
    from tuner.errors import SlotLostError
    from tuner.store import RoundHold

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    job = store.create_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                           device_name=None, trials=1, sampler="random", samples=2, candidate_timeout_s=60.0,
                           tasks=[("n=256", "n=256", '{"n": 256}')])
    fields = {"host": "h", "device_kind": "cpu", "device_name": "CPU", "device_index": 0, "backends": ["triton"],
              "fingerprint_hash": "f", "fingerprint_json": "{}"}
    store.register_worker(worker_id="a", pid=1, lease_s=0.01, **fields)
    claim = store.claim_task(worker_id="a", device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None and claim.job.id == job.id and store.end_search(task_id=claim.task.id)
    assert store.begin_finalize(task_id=claim.task.id, worker_id="a")
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=5)
    run_trials(ctx, CountBudget(3))
    time.sleep(0.05)
    assert store.reap_lost_workers() == ["a"]
    store.register_worker(worker_id="b", pid=2, lease_s=30.0, **fields)
    assert store.claim_task(worker_id="b", device_kind="cpu", device_name="CPU", backends=["triton"]) is not None
    assert store.begin_finalize(task_id=claim.task.id, worker_id="b")
    theirs = finalize(ctx, finalists=1, comparators=False, hold=RoundHold(claim.task.id, "b"))
    assert theirs.published
    with pytest.raises(SlotLostError):
        finalize(ctx, finalists=2, comparators=False, hold=RoundHold(claim.task.id, "a"))
    best = store.get_study_best(study_id=ctx.study_id)
    assert theirs.winner is not None and best is not None and best.measurement_id == theirs.winner.measurement_id


def test_a_round_does_not_publish_a_winner_disproved_after_its_read(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A verification disproves the round's fastest config between the round's last read of the disproved
    configs and its publish (here: while the round asks ``may_publish``): the store's check at the publish
    leaves it out and the round publishes its next fastest config."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=5)
    run_trials(ctx, CountBudget(4))
    study = store.get_study(study_id=ctx.study_id)
    assert study is not None
    wrong: list[str] = []

    def verification_meanwhile() -> bool:
        finals = [m for m in store.list_measurements(study_id=ctx.study_id, role="final", status=Status.OK)
                  if not m.candidate.startswith(COMPARATOR_PREFIX)]
        fastest = min(finals, key=lambda m: m.median_us or float("inf"))
        figures = [{"process": 1, "candidates": [{"label": VERIFIED_LABEL, "status": "WRONG_RESULT"}]}]
        store.add_verification(
            study_id=ctx.study_id, config_json=fastest.config_json, stored_us=1.0, median_us=None, low_us=None,
            high_us=None, drift=None, tolerance=0.03, flagged=True, processes=1, figures=figures,
            device_kind=study.device_kind, device_name=study.device_name, fingerprint_hash="f", fingerprint_json="{}")
        wrong.append(fastest.config_json)
        return True

    final = finalize(ctx, finalists=2, comparators=False, may_publish=verification_meanwhile)
    best = store.get_study_best(study_id=ctx.study_id)
    assert wrong and final.published and final.winner is not None and best is not None
    assert best.config_json != wrong[0] and best.measurement_id == final.winner.measurement_id


def test_new_studies_start_from_default_seeds_and_neighbours_best(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    first = open_study(NAME, Shape(n=512), store=store, measurer=measurer, sampler="random", seed=5)
    run_trials(first, CountBudget(6))
    winner = finalize(first, comparators=False).winner
    assert winner is not None
    second = open_study(NAME, Shape(n=1024), store=store, measurer=measurer, sampler="random", seed=5)
    records = run_trials(second, CountBudget(2))
    assert records[0].config == Config(mode="ok", BLOCK=64)  # the default, first
    assert records[1].config == winner.result.config or winner.result.config == records[0].config


def test_a_neighbours_config_invalid_for_the_shape_is_repaired_into_the_warm_starts() -> None:
    from tuner import registry
    from tuner.driver.study import order_warm_starts
    from tuner.frozen import Config
    from tuner.lookup import Entry

    spec = registry.spec("mamba3_mimo_bwd")
    space = spec.space()
    r4 = spec.workload("mimo-n128-p64-r4")
    r16 = spec.make_shape({**r4.to_dict(), "R": 16})
    # R=1's winner: 32 rows hold 32 steps at R=1, 2 at R=16 (fewer than the 4 a chunk needs): invalid there.
    winner = Config({"variant": "split2", "chunk_rows": 32, "block_n": 64, "prec": "lowp3", "prec_rot": "lowp3",
                     "num_warps": 4, "num_stages": 3, "scan_block": 512, "scan_chunks": 8, "group_chunks": 4,
                     "state_pass": "scan", "qk_warps": "same"})
    r1 = spec.workload("mimo-n128-p64-r1")
    assert space.is_valid(winner, r1) and not space.is_valid(winner, r16)
    def entry(shape: Shape, config: Config) -> Entry:
        return Entry("mamba3_mimo_bwd", spec.version, shape.to_dict(), "cuda", "H200", config.to_dict())

    starts = order_warm_starts(space, r16, [entry(r1, winner), entry(r4, space.default)], limit=4)
    repaired = [c for c in starts if c not in (space.default, *space.seeds)]
    # The lookup's repair: 64 rows (4 steps) and, for the registers that 64 rows need, block_n 64 -> 32.
    assert repaired == [winner.replace(chunk_rows=64, block_n=32)] and space.is_valid(repaired[0], r16)


def test_the_neighbours_bests_come_before_the_seeds_so_a_short_study_measures_what_was_served() -> None:
    """A study shorter than the space's seed list (the TileLang chunk cumsum has dozens of seeds) measures the
    nearest neighbour's best, which the lookup served the shape until then, right after the default; then
    the other neighbours, then each valid seed once."""
    from tuner import registry
    from tuner.driver.study import order_warm_starts
    from tuner.frozen import Config
    from tuner.lookup import Entry

    spec = registry.spec("mamba2_chunk_cumsum_tilelang")
    space = spec.space()
    assert len(space.seeds) > 24  # longer than a short study
    here = spec.make_shape({"B": 1, "S": 2048, "H": 24, "has_bias": True, "dtype": "float16"})
    near = spec.workload("mamba2-780m-b1-s4k")
    far = spec.workload("mamba2-2p7b-b2-s32k-dt-bias")
    served = Config({**space.default.to_dict(), "scan": "warp", "store": "direct", "layout": "hq", "pad": 4,
                     "block_h": 4, "threads": 128, "min_blocks": 16})
    other = Config({**space.default.to_dict(), "min_blocks": 8, "load_cache": "streaming", "pad": 2})
    assert served not in space.seeds and other not in space.seeds
    assert space.is_valid(served, here) and space.is_valid(other, here)

    def entry(shape: Shape, config: Config) -> Entry:
        return Entry(spec.name, spec.version, shape.to_dict(), "cuda", "H200", config.to_dict())

    starts = order_warm_starts(space, here, [entry(far, other), entry(near, served)], limit=4)
    seeds = [c for c in dict.fromkeys(space.seeds) if c != space.default and space.is_valid(c, here)]
    assert starts[:3] == [space.default, served, other], starts[:3]
    assert starts[3:] == seeds and len(starts) == len(set(starts))
    # Without neighbours (a first shape): the default, then the seeds, as before; the warp scan's first (the
    # design that won every workload: a short first study measures its seeds before the two-level scan's).
    first = order_warm_starts(space, here, [], limit=4)
    assert first == [space.default, *seeds]
    assert [c["scan"] for c in first[1:8]] == ["warp"] * 7, first[1:8]


def test_warm_starts_take_each_neighbour_shape_once_its_latest_best_nearest_first(db_url: str) -> None:
    from tests.fixtures.fault_templates import TunableFaultVectorScale
    from tests.fixtures.servers import publish
    from tuner.driver.study import warm_starts
    from tuner.measure.devices.base import Fingerprint

    space = TunableFaultVectorScale().space()
    with db.Store.open(db_url) as store:
        # 512 was tuned twice (two software versions): only its latest best is a neighbour, once.
        publish(store, NAME, {"n": 512}, {"mode": "raise", "BLOCK": 256}, 5.0, libraries={"triton": "3.4"})
        publish(store, NAME, {"n": 512}, {"mode": "ok", "BLOCK": 256}, 4.0, libraries={"triton": "3.5"})
        publish(store, NAME, {"n": 128}, {"mode": "wrong", "BLOCK": 128}, 1.0)
        publish(store, NAME, {"n": 1024}, {"mode": "nan", "BLOCK": 512}, 8.0)  # BLOCK > 256: repaired
        publish(store, NAME, {"n": 2048}, {"mode": "ok", "BLOCK": 64}, 9.0)  # the default: once
        publish(store, NAME, {"n": 16}, {"mode": "unwritten", "BLOCK": 16}, 0.5)  # fifth nearest: beyond limit 4
        key = StudyKey.of(NAME, "1", Shape(n=256), Fingerprint(kind="cpu", device_name="test-cpu", driver="test"))
        starts = warm_starts(store, space, key, limit=4)
    # The default, then the four nearest shapes' configs (distance 1: 128 and 512, in shape order; 1024 at 2;
    # 2048 at 3), each valid for n=256 (1024's repaired: BLOCK 512 -> 256), each config once.
    assert starts == [Config(mode="ok", BLOCK=64), Config(mode="wrong", BLOCK=128), Config(mode="ok", BLOCK=256),
                      Config(mode="nan", BLOCK=256)], starts


def test_a_new_versions_study_measures_the_carried_versions_best_of_its_shape_first(db_url: str) -> None:
    """MIMO version 4 carries versions 3 and 2: a version-4 study of a shape tuned only under version 2 measures
    that best (completed with state_pass=scan and qk_warps=same, what the lookup serves there until version 4
    publishes) right after the default, ahead of the seeds; another shape's version-2 best is not a warm start
    of it."""
    from tests.fixtures.servers import publish
    from tuner import registry
    from tuner.driver.study import warm_starts
    from tuner.measure.devices.base import Fingerprint

    spec = registry.spec("mamba3_mimo_bwd")
    space = spec.space()
    r4, r2 = spec.workload("mimo-n128-p64-r4"), spec.workload("mimo-n128-p64-r2")
    v2 = {"variant": "split2", "chunk_rows": 16, "block_n": 32, "prec": "lowp3", "prec_rot": "lowp3",
          "num_warps": 4, "num_stages": 1, "scan_block": 256, "scan_chunks": 8, "group_chunks": 4}
    other = {**v2, "block_n": 64}
    carried = {"state_pass": "scan", "qk_warps": "same"}  # what version 4 adds to a version-2 config
    h200 = {"device_kind": "cuda", "device_name": "NVIDIA H200", "version": "2"}
    with db.Store.open(db_url) as store:
        publish(store, spec.name, r4.to_dict(), {**v2, "num_stages": 2}, 3700.0, **h200)  # superseded below
        publish(store, spec.name, r4.to_dict(), v2, 3681.6, **h200)
        publish(store, spec.name, r2.to_dict(), other, 2001.8, **h200)
        key = StudyKey.of(spec.name, spec.version, r4, Fingerprint(kind="cuda", device_name="NVIDIA H200",
                                                                   driver="test"))
        starts = warm_starts(store, space, key, carries=spec.carries)
        assert warm_starts(store, space, key) == [c for c in starts if c != Config({**v2, **carried})]
    assert starts[:2] == [space.default, Config({**v2, **carried})]
    assert Config({**other, **carried}) not in starts and set(starts[2:]) <= set(space.seeds)
    with db.Store.open(db_url) as store:
        # a carried config the current constraints reject is repaired as the lookup repairs it (served so)
        publish(store, spec.name, r4.to_dict(), {**v2, "scan_block": 2048}, 3600.0, **h200)
        repaired = warm_starts(store, space, key, carries=spec.carries)
        assert repaired[1] == Config({**v2, **carried, "scan_block": 1024})
        # once this version has its own best here, the carried config is not served: not a warm start either
        publish(store, spec.name, r4.to_dict(), {**v2, **carried, "state_pass": "walk", "scan_chunks": 4}, 3188.4,
                **{**h200, "version": spec.version})
        assert Config({**v2, **carried, "scan_block": 1024}) not in warm_starts(
            store, space, key, carries=spec.carries)


def test_a_time_limit_stops_new_trials_and_the_final_round_still_runs(db_url: str, measurer: Measurer) -> None:
    """DeadlineBudget (the CLI's --time-limit) on a clock that advances one second per reading: a limit of
    3.5 s grants the reserves read at 1, 2 and 3 s and refuses the one at 4 s, whatever the count left."""
    ticks = iter(range(1000))
    count = CountBudget(50)
    budget = DeadlineBudget(count, 3.5, clock=lambda: float(next(ticks)))
    ctx = open_study(NAME, Shape(n=256), store=db.Store.open(db_url), measurer=measurer, sampler="random", seed=5)
    records = run_trials(ctx, budget)
    assert budget.expired and count.used == sum(1 for r in records if r.measured)
    granted = [r for r in records if r.duplicate_of is None]  # each took one reserve (invalid ones gave it back)
    assert len(granted) == 3 and count.used <= 3
    final = finalize(ctx, finalists=1, comparators=False)
    assert final.winner is not None and final.published


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_a_time_limit_must_be_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match="time limit must be positive"):
        DeadlineBudget(CountBudget(1), seconds)


def test_a_config_stored_invalid_under_a_stricter_space_is_measured_once_it_is_valid(
    db_url: str, measurer: Measurer
) -> None:
    """An INVALID trial row is what an earlier, stricter version of the space's constraints said: once the
    config passes the check, the sweep measures it instead of answering from that row (as a duplicate), and
    an exhaustive sweep counts it as still to measure."""
    from tuner.driver.exhaustive import measured_configs
    from tuner.driver.study import CONFIG_LABEL, new_measurement
    from tuner.results import MeasureResult

    store = db.Store.open(db_url)
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    default = Config(mode="ok", BLOCK=64)  # queued first in a new study, valid for n=256
    store.record_measurement(new_measurement(
        MeasureResult(Status.INVALID, default, reason="C = 2 steps (an older constraint)"),
        study_id=ctx.study_id, role="trial", candidate=CONFIG_LABEL, trial_number=None))
    assert default not in measured_configs(store, ctx.study_id)
    (record,) = run_trials(ctx, CountBudget(1))
    assert record.config == default and record.status is Status.OK and record.measured
    assert record.duplicate_of is None
    assert default in measured_configs(store, ctx.study_id)


def test_a_time_limit_passing_after_the_count_is_spent_is_not_reported_as_the_cut() -> None:
    """The count ran out first: the limit did not cut the sweep, so ``expired`` stays false."""
    ticks = iter(range(1000))
    count = CountBudget(2)
    budget = DeadlineBudget(count, 2.5, clock=lambda: float(next(ticks)))
    assert budget.reserve() is not None and budget.reserve() is not None  # read at 1 and 2 s
    assert budget.reserve() is None and not budget.expired and count.used == 2


def test_a_warm_start_pruned_as_invalid_under_a_stricter_space_is_queued_again(
    db_url: str, measurer: Measurer
) -> None:
    """The study's default was proposed and pruned as INVALID (as under an earlier, stricter space); at the
    next opening it is valid, so it is queued again and measured (a duplicate-pruned trial would not be)."""
    from tuner.driver import optuna_access
    from tuner.driver.study import settled_params

    store = db.Store.open(db_url)
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    trial = optuna_access.ask(ctx.study)  # pops the queued default
    default = ctx.space.suggest(trial)
    assert default == Config(mode="ok", BLOCK=64)
    trial.set_user_attr("status", Status.INVALID.value)
    ctx.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert default.to_dict() not in settled_params(ctx.study, heartbeats=False, waiting=False)
    # A trial pruned as a duplicate of one in flight (status label DUPLICATE, no Status) is settled while the
    # trial it stepped aside for is: measured here.
    measured = optuna_access.ask(ctx.study)
    other = _step_aside_for(ctx, measured)
    ctx.study.tell(measured, 1.0)
    assert other.to_dict() in settled_params(ctx.study, heartbeats=False, waiting=False)
    again = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    (record,) = run_trials(again, CountBudget(1))
    assert record.config == default and record.measured and record.status is Status.OK


def test_the_final_round_skips_configs_it_disproved_and_runs_the_incumbent_beside_the_finalists(
    tmp_path, measurer: Measurer,  # type: ignore[no-untyped-def]
) -> None:
    """On the H200 a round's three finalists, fastest in their trials, all failed the error bound on the
    round's own inputs, and the default was published over the faster incumbent. The incumbent now runs in
    every round, and a config a round disproved gives its place to the next fastest."""
    from tuner.driver.study import CONFIG_LABEL, store_result, top_configs
    from tuner.results import MeasureResult, SampleSummary

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    fast, second, held = (Config(mode="ok", BLOCK=b) for b in (16, 32, 128))
    for number, (config, us) in enumerate([(fast, 1.0), (second, 2.0), (held, 3.0)]):  # the sweep's order
        store_result(ctx, MeasureResult(Status.OK, config, SampleSummary.of([us])), role="trial",
                     candidate=CONFIG_LABEL, trial_number=number)
    assert top_configs(ctx, 1) == [fast]
    # An earlier round: `fast` failed on the round's inputs, `held` was published.
    store_result(ctx, MeasureResult(Status.WRONG_RESULT, fast, reason="relative L2 error over its bound"),
                 role="final", candidate=CONFIG_LABEL, round_id="earlier")
    published = store_result(ctx, MeasureResult(Status.OK, held, SampleSummary.of([3.0])), role="final",
                             candidate=CONFIG_LABEL, round_id="earlier")
    store.publish_best(study_id=ctx.study_id, measurement_id=published)
    assert top_configs(ctx, 1) == [second]
    final = finalize(ctx, finalists=1, comparators=False)
    assert [(e.label, e.result.config) for e in final.entries] == [
        (CONFIG_LABEL, second), (CONFIG_LABEL, held), ("default", Config(mode="ok", BLOCK=64))]
    assert all(e.result.ok for e in final.entries) and final.published


def test_a_study_without_a_best_runs_the_carried_config_the_lookup_serves_in_its_final_round(
    tmp_path, measurer: Measurer,  # type: ignore[no-untyped-def]
) -> None:
    """A new version's exhaustive sweep of a subspace measures no warm starts, and its first published best is
    served over the carried version's, faster or not: its final round runs the carried config too (the lookup's
    answer until then), so that a slower subspace config is not published over it."""
    import dataclasses

    from tests.fixtures.fault_templates import TunableFaultVectorScale
    from tests.fixtures.servers import publish
    from tuner.driver.study import CONFIG_LABEL, store_result
    from tuner.results import MeasureResult, SampleSummary
    from tuner.spec import CarriedVersion

    class Carrying(TunableFaultVectorScale):
        @property
        def spec(self):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().spec, carries=(CarriedVersion("0"),))

    carried, subspace = Config(mode="ok", BLOCK=128), Config(mode="ok", BLOCK=16)

    def study(name: str) -> StudyContext:  # a fresh store: a version-0 best of the shape, one subspace trial
        store = db.Store.open(db.sqlite_url(tmp_path / f"{name}.db"))
        ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
        publish(store, NAME, {"n": 256}, carried.to_dict(), 0.5, device_kind=ctx.key.device_kind,
                device_name=ctx.key.device_name, version="0")
        store_result(ctx, MeasureResult(Status.OK, subspace, SampleSummary.of([1.0])), role="trial",
                     candidate=CONFIG_LABEL, trial_number=0)
        return ctx

    plain = finalize(study("plain"), finalists=1, comparators=False, include_default=False)  # carries nothing
    assert [e.result.config for e in plain.entries] == [subspace]
    ctx = study("carrying")
    ctx.template = Carrying()
    final = finalize(ctx, finalists=1, comparators=False, include_default=False)
    assert [(e.label, e.result.config) for e in final.entries] == [(CONFIG_LABEL, subspace), (CONFIG_LABEL, carried)]
    assert all(e.result.ok for e in final.entries) and final.published


def test_the_final_round_verifies_on_several_input_sets(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A config right on the trial's inputs and wrong on others (the fixture's ``edge`` mode, as a config at
    its error bound) is not published: the final round checks FINAL_CHECK_SEEDS input sets."""
    from tests.fixtures.fault_templates import EDGE_SCALE, TunableFaultVectorScale
    from tuner.driver.study import CONFIG_LABEL, FINAL_CHECK_SEEDS, store_result
    from tuner.results import MeasureResult, SampleSummary

    template, shape = TunableFaultVectorScale(), Shape(n=256)

    def wrong_on(seed: int) -> bool:
        return float(template.make_inputs(shape, "cpu", seed)["a"]) > EDGE_SCALE

    # A study seed whose final round starts on inputs the edge config gets right, then meets wrong ones.
    first = 1_000_003
    seed = next(s for s in range(500) if not wrong_on(s + first)
                and any(wrong_on(s + first + k) for k in range(1, FINAL_CHECK_SEEDS)))
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=seed)
    edge = Config(mode="edge", BLOCK=64)
    store_result(ctx, MeasureResult(Status.OK, edge, SampleSummary.of([1.0])), role="trial",
                 candidate=CONFIG_LABEL, trial_number=0)
    one_set = finalize(ctx, finalists=1, comparators=False, check_seeds=1)
    assert one_set.entries[0].result.config == edge and one_set.entries[0].result.ok
    final = finalize(ctx, finalists=1, comparators=False)
    (checked,) = [e for e in final.entries if e.result.config == edge]
    assert checked.result.status is Status.WRONG_RESULT
    assert f"inputs seed {seed + first}" not in (checked.result.reason or "")


@pytest.fixture
def near_template() -> Iterator[str]:
    """The near-bound fixture template, registered for one test only."""
    from tests.fixtures.fault_templates import NEAR_BOUND_REF

    registry.register("fault_vector_scale_near", NEAR_BOUND_REF)
    yield "fault_vector_scale_near"
    registry.unregister("fault_vector_scale_near")


CLOSE, FAR = Config(mode="near", BLOCK=64), Config(mode="far", BLOCK=64)  # the near-bound template's two modes


def _round_of_near_and_far(
    tmp_path: Path, measurer: Measurer, template: str, shape: Shape, seed: int
) -> tuple[db.Store, StudyContext, FinalRound]:
    """A study of the near-bound ``template`` (seed ``seed``) whose two trials are CLOSE (faster) and FAR, and
    its final round of both (the default beside them, no comparators)."""
    from tuner.driver.study import CONFIG_LABEL, store_result
    from tuner.results import MeasureResult, SampleSummary

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(template, shape, store=store, measurer=measurer, sampler="random", seed=seed)
    for number, config in enumerate([CLOSE, FAR]):
        store_result(ctx, MeasureResult(Status.OK, config, SampleSummary.of([1.0 + number])), role="trial",
                     candidate=CONFIG_LABEL, trial_number=number)
    return store, ctx, finalize(ctx, finalists=2, comparators=False)


ROUND_SEED = 1_000_003  # a final round's input sets start at the study's seed plus this (finalize)


def _round_fractions(mode: str, shape: Shape, count: int) -> list[list[float]]:
    """For each study seed below ``count``: the near-bound template's ``mode`` error on every input set a final
    round checks (FINAL_CHECK_SEEDS, then FINAL_NEAR_BOUND's extra ones), as fractions of its bound."""
    from tests.fixtures.fault_templates import input_fraction
    from tuner.driver.study import FINAL_CHECK_SEEDS, FINAL_NEAR_BOUND

    sets = FINAL_CHECK_SEEDS + FINAL_NEAR_BOUND.extra_seeds
    each = [input_fraction(mode, shape, s + ROUND_SEED) for s in range(count + sets)]
    return [each[s:s + sets] for s in range(count)]


def test_a_finalist_near_its_bound_is_checked_on_more_input_sets_and_not_published(  # type: ignore[no-untyped-def]
    tmp_path, measurer: Measurer, near_template: str
) -> None:
    """Two finalists of one round: ``near`` passes the round's FINAL_CHECK_SEEDS sets close to its bound and
    fails one of the FINAL_NEAR_BOUND extra sets: WRONG_RESULT naming that seed, not published, disproved for
    later rounds; ``far`` is checked on the round's sets only (its errors are their worst, though an extra set
    would show a larger one) and the round publishes."""
    from tests.fixtures.fault_templates import NEAR_RTOL
    from tuner.driver.study import FINAL_CHECK_SEEDS

    shape, first, usual = Shape(n=256), ROUND_SEED, FINAL_CHECK_SEEDS
    near, far = _round_fractions("near", shape, 600), _round_fractions("far", shape, 600)
    seed = next(s for s in range(600) if 0.5 <= max(near[s][:usual]) < 0.998
                and any(x > 1.002 for x in near[s][usual:]))
    wrong_at = seed + first + next(k for k, x in enumerate(near[seed]) if x >= 1)
    store, ctx, final = _round_of_near_and_far(tmp_path, measurer, near_template, shape, seed)
    by_config = {e.result.config: e.result for e in final.entries}
    assert by_config[CLOSE].status is Status.WRONG_RESULT
    assert (by_config[CLOSE].reason or "").startswith(f"inputs seed {wrong_at}: ")
    assert wrong_at >= seed + first + usual  # an extra set: the round's own passed
    assert by_config[FAR].status is Status.OK
    far_usual = max(far[seed][:usual])
    assert by_config[FAR].errors["y"] / NEAR_RTOL == pytest.approx(far_usual, abs=1e-4)
    assert max(far[seed][usual:]) > far_usual + 1e-3
    assert final.published and final.winner is not None and final.winner.result.config != CLOSE
    best = store.get_best(template=near_template, shape_key=shape.key())
    assert best is not None and best.config != CLOSE.to_dict()
    (stored,) = [m for m in store.list_measurements(study_id=ctx.study_id, role="final")
                 if Config.from_json(m.config_json) == CLOSE]
    assert stored.status is Status.WRONG_RESULT and stored.reason == by_config[CLOSE].reason
    wrong_error = near[seed][wrong_at - first - seed]  # the worst of the sets it was checked on
    assert stored.errors["y"] / NEAR_RTOL == pytest.approx(wrong_error, abs=1e-3)
    assert CLOSE not in [e.result.config for e in finalize(ctx, finalists=2, comparators=False).entries]


def test_a_finalist_right_on_every_set_but_at_its_bound_is_not_published(  # type: ignore[no-untyped-def]
    tmp_path, measurer: Measurer, near_template: str
) -> None:
    """A faster finalist that passes every set of the round (its FINAL_CHECK_SEEDS and the FINAL_NEAR_BOUND
    extra ones) but within FINAL_NEAR_BOUND's headroom of its bound is WRONG_RESULT (the reason says how near),
    so the round publishes a config that keeps the headroom; `tuner verify`'s checks (the bounds themselves)
    would pass it."""
    from tuner.driver.study import FINAL_CHECK_SEEDS, FINAL_NEAR_BOUND, VERIFY_NEAR_BOUND

    assert FINAL_NEAR_BOUND.headroom < 1 and VERIFY_NEAR_BOUND.headroom == 1
    shape, first = Shape(n=256), ROUND_SEED
    more = FINAL_CHECK_SEEDS + FINAL_NEAR_BOUND.extra_seeds
    near = _round_fractions("near", shape, 600)
    seed = next(s for s in range(600) if max(near[s][:FINAL_CHECK_SEEDS]) >= 0.5
                and FINAL_NEAR_BOUND.headroom + 0.003 <= max(near[s]) < 0.997)
    store, _, final = _round_of_near_and_far(tmp_path, measurer, near_template, shape, seed)
    by_config = {e.result.config: e.result for e in final.entries}
    assert by_config[CLOSE].status is Status.WRONG_RESULT
    reason = by_config[CLOSE].reason or ""
    assert reason.startswith(f"inputs seeds {seed + first}-{seed + first + more - 1}: output 'y': ")
    assert re.search(r"is 0\.9[789]\d of its bound 0\.001; asked: under 0\.97 of it", reason)
    assert by_config[FAR].status is Status.OK
    assert final.published and final.winner is not None and final.winner.result.config != CLOSE
    assert final.winner.result.status is Status.OK
    best = store.get_best(template=near_template, shape_key=shape.key())
    assert best is not None and best.config == final.winner.result.config.to_dict()


def test_a_trial_within_the_final_rounds_headroom_of_its_bound_fails_and_is_no_finalist(  # type: ignore[no-untyped-def]
    tmp_path, measurer: Measurer, near_template: str
) -> None:
    """A trial whose config passes its one input set within FINAL_NEAR_BOUND's headroom of the bound is
    WRONG_RESULT (TRIAL_NEAR_BOUND): stored so, FAIL in the study (no longer a fast config to the sampler),
    and never a finalist, so the round's places go to configs it can publish."""
    from tests.fixtures.fault_templates import input_fraction
    from tuner.driver.study import TRIAL_NEAR_BOUND

    shape = Shape(n=256)
    seed = next(s for s in range(600) if TRIAL_NEAR_BOUND.headroom + 0.003 <= input_fraction("near", shape, s + 1)
                < 0.997)
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(near_template, shape, store=store, measurer=measurer, sampler="random", seed=seed)
    for config in (CLOSE, FAR):  # trials 1 and 2, after the default (trial 0)
        ctx.study.enqueue_trial(config.to_dict())
    records = {r.config: r for r in run_trials(ctx, CountBudget(3))}
    close = records[CLOSE]
    assert close.number == 1 and close.status is Status.WRONG_RESULT
    assert (close.reason or "").startswith(f"inputs seed {seed + 1}: output 'y': ")
    assert "asked: under 0.97 of it" in (close.reason or "")
    assert records[FAR].status is Status.OK
    assert ctx.study.trials[close.number].state is optuna.trial.TrialState.FAIL
    (stored,) = [m for m in store.list_measurements(study_id=ctx.study_id, role="trial")
                 if Config.from_json(m.config_json) == CLOSE]
    assert stored.status is Status.WRONG_RESULT and stored.reason == close.reason
    final = finalize(ctx, finalists=2, comparators=False)
    assert CLOSE not in [e.result.config for e in final.entries] and final.published


def test_finalists_pass_over_ok_trials_stored_before_the_trial_headroom_that_lack_it(  # type: ignore[no-untyped-def]
    tmp_path, measurer: Measurer, near_template: str
) -> None:
    """A trial stored OK before trials asked TRIAL_NEAR_BOUND's headroom, at 0.98 of its bound, is no finalist
    (the round would refuse it); one at 0.96 still is, in speed order."""
    from tests.fixtures.fault_templates import NEAR_RTOL
    from tuner.driver.study import CONFIG_LABEL, store_result, top_configs
    from tuner.results import MeasureResult, SampleSummary

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(near_template, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=0)
    kept = Config(mode="near", BLOCK=128)
    for number, (config, fraction) in enumerate([(CLOSE, 0.98), (kept, 0.96), (FAR, 0.1)]):
        store_result(ctx, MeasureResult(Status.OK, config, SampleSummary.of([1.0 + number]),
                                        errors={"y": fraction * NEAR_RTOL}),
                     role="trial", candidate=CONFIG_LABEL, trial_number=number)
    assert top_configs(ctx, 3) == [kept, FAR]


def test_a_duplicate_of_an_ok_trial_stored_before_the_trial_headroom_that_lacks_it_is_wrong_result(  # type: ignore[no-untyped-def]
    tmp_path, measurer: Measurer, near_template: str
) -> None:
    """A trial proposing a config the study stored OK before trials asked TRIAL_NEAR_BOUND's headroom, at 0.98
    of its bound, reuses that row as WRONG_RESULT (FAIL in the study, the reason says why) and measures
    nothing; one at 0.96 is reused as OK. The stored rows are left as they were measured."""
    from tests.fixtures.fault_templates import NEAR_RTOL
    from tuner.driver.study import CONFIG_LABEL, store_result
    from tuner.results import MeasureResult, SampleSummary

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(near_template, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=0)
    kept = Config(mode="near", BLOCK=128)
    for number, (config, fraction) in enumerate([(CLOSE, 0.98), (kept, 0.96)], start=100):
        store_result(ctx, MeasureResult(Status.OK, config, SampleSummary.of([1.0]),
                                        errors={"y": fraction * NEAR_RTOL}),
                     role="trial", candidate=CONFIG_LABEL, trial_number=number)
    for config in (CLOSE, kept, FAR):  # trials 1-3, after the default (trial 0)
        ctx.study.enqueue_trial(config.to_dict())
    records = {r.config: r for r in run_trials(ctx, CountBudget(2))}  # the default and FAR are measured
    close, again = records[CLOSE], records[kept]
    assert close.duplicate_of == 100 and close.status is Status.WRONG_RESULT and not close.measured
    assert (close.reason or "").startswith("stored OK in trial 100 before trials asked the headroom: output 'y': ")
    assert "is 0.980 of its bound 0.001; asked: under 0.97 of it" in (close.reason or "")
    assert ctx.study.trials[close.number].state is optuna.trial.TrialState.FAIL
    assert again.duplicate_of == 101 and again.status is Status.OK
    assert ctx.study.trials[again.number].state is optuna.trial.TrialState.COMPLETE
    rows = store.list_measurements(study_id=ctx.study_id, role="trial")
    assert [r.status for r in rows if r.trial_number in (100, 101)] == [Status.OK, Status.OK]
    assert records[FAR].measured and len([r for r in rows if Config.from_json(r.config_json) == CLOSE]) == 1


def test_a_sampler_stuck_on_known_configs_gets_the_ones_the_study_lacks(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A sampler that proposes one config for ever (Optuna's PartialFixedSampler over every parameter): after
    LOOK_AFTER_SKIPS known proposals in a row the loop queues a valid config the study lacks, so the budget is
    spent on distinct configs; once the study holds every valid config the loop ends at the next look (not
    after the 200 known proposals of the stall rule) and says it stalled."""
    from tuner.driver.trials import LOOK_AFTER_SKIPS

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    ctx = open_study(NAME, shape, store=store, measurer=measurer, sampler="random", seed=2)
    valid = set(ctx.space.valid_configs(shape))
    assert 3 <= len(valid) <= 40  # a small space: every config can be asked for
    stuck = Config(ctx.space.default)
    ctx.study.sampler = optuna.samplers.PartialFixedSampler(stuck.to_dict(), optuna.samplers.RandomSampler(seed=0))
    first = run_trials(ctx, CountBudget(3))
    measured = [r for r in first if r.measured]
    assert len(measured) == 3 and len({r.config for r in measured}) == 3 and not ctx.stalled
    assert sum(1 for r in first if not r.measured) <= 2 * LOOK_AFTER_SKIPS
    rest = run_trials(ctx, CountBudget(len(valid) + 5))
    everything = measured + [r for r in rest if r.measured]
    assert {r.config for r in everything} == valid  # every valid config measured once
    assert len(everything) == len(valid) and ctx.stalled
    known_in_a_row = len(rest) - 1 - max(i for i, r in enumerate(rest) if r.measured)
    assert known_in_a_row == LOOK_AFTER_SKIPS  # ended at the first look that found nothing left


def test_the_look_picks_an_unheld_config_by_its_seed_and_skips_finite_lists() -> None:
    """The look's two rules, which the trial loop and benchmarks/search.py's replay share: a pick is never a
    held config, repeats with its seed, and is None once every config is held; the look comes at every
    LOOK_AFTER_SKIPS-th proposal in a row that needed no measurement, never for a grid (its list ends it)."""
    from tuner.driver.trials import LOOK_AFTER_SKIPS, looks_at_space, pick_unseen

    valid = [Config({"a": i}) for i in range(10)]
    held = set(valid[:7])
    picks = {pick_unseen(valid, held, f"s/{k}") for k in range(40)}
    assert picks == set(valid[7:])  # only unheld ones, and each of them under some seed
    assert pick_unseen(valid, held, "s/1") == pick_unseen(valid, held, "s/1")
    assert pick_unseen(valid, set(valid), "s/1") is None
    tpe = optuna.samplers.TPESampler(seed=0)
    grid = optuna.samplers.GridSampler({"a": list(range(10))}, seed=0)
    assert [k for k in range(1, 3 * LOOK_AFTER_SKIPS + 1) if looks_at_space(k, tpe)] == [
        LOOK_AFTER_SKIPS, 2 * LOOK_AFTER_SKIPS, 3 * LOOK_AFTER_SKIPS]
    assert not any(looks_at_space(k, grid) for k in range(1, 3 * LOOK_AFTER_SKIPS + 1))


def test_a_final_round_keeps_the_served_config_unless_the_fastest_beats_it_clearly() -> None:
    """A published best changes on evidence, not on noise: the config served now stays first unless the
    fastest of the round ran at least 80% of its samples under the served config's median. The H200 case
    (2026-12-05): 2p7b-b1-s8k's served config ran 3.68 µs, a challenger 3.65 (p80 3.74); the challenger, once
    published, ran 24% slower on the H = 128 shape served from it."""
    from tuner.driver.study import CONFIG_LABEL, FinalEntry, beats_beyond_noise, keep_served
    from tuner.results import MeasureResult, SampleSummary

    def entry(block: int, samples: list[float]) -> FinalEntry:
        return FinalEntry(CONFIG_LABEL, MeasureResult(Status.OK, Config(mode="ok", BLOCK=block),
                                                      SampleSummary.of(samples)), block)

    # 32 ns steps, as CUPTI times a 3.7 µs kernel
    challenger = entry(16, [3.616] * 3 + [3.648] * 3 + [3.68] * 2 + [3.744] * 2)  # median 3.648, p80 3.7
    served = entry(32, [3.648] * 3 + [3.68] * 4 + [3.744] * 3)  # median 3.68
    third = entry(64, [3.9] * 10)
    def clearly_faster(a: FinalEntry, b: FinalEntry) -> bool:
        assert a.result.summary is not None and b.result.summary is not None
        return beats_beyond_noise(a.result.summary.p80_us, b.result.summary.median_us)

    assert challenger.result.summary is not None and challenger.result.summary.p80_us >= 3.68
    assert not clearly_faster(challenger, served)
    kept = keep_served([challenger, served, third], served.result.config)
    assert [e.measurement_id for e in kept] == [32, 16, 64]  # the rest keep their order after it
    # clearly faster: every sample of the challenger under the served median
    fast = entry(8, [3.2] * 10)
    assert clearly_faster(fast, served)
    assert [e.measurement_id for e in keep_served([fast, served], served.result.config)] == [8, 32]
    # nothing served, the served config not in the round (disproved, failed), or already the fastest: as sorted
    assert [e.measurement_id for e in keep_served([challenger, served], None)] == [16, 32]
    assert [e.measurement_id for e in keep_served([challenger, third], served.result.config)] == [16, 64]
    assert [e.measurement_id for e in keep_served([served, third], served.result.config)] == [32, 64]


def test_the_report_shows_the_config_a_round_kept_rather_than_its_fastest(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A round that kept the served config over a faster one within noise published the served one: the
    report (as the pages and /v1/studies) shows what was published, with its own time, not the round's
    fastest."""
    from tuner.driver.study import CONFIG_LABEL, store_result
    from tuner.results import MeasureResult, SampleSummary
    from tuner.store.entries import round_winner

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    fastest, kept = Config(mode="ok", BLOCK=16), Config(mode="ok", BLOCK=32)
    ids = {c: store_result(ctx, MeasureResult(Status.OK, c, SampleSummary.of(us)), role="final",
                           candidate=CONFIG_LABEL, round_id="r")
           for c, us in ((fastest, [3.616, 3.648, 3.744]), (kept, [3.648, 3.68, 3.744]))}
    store.publish_best(study_id=ctx.study_id, measurement_id=ids[kept])
    (row,) = collect(store, NAME).rows
    assert row.best_config == kept and row.best_us == 3.68
    final = store.latest_round(study_id=ctx.study_id)
    assert Config.from_json(round_winner(final).config_json) == fastest  # nothing published: the fastest
    # a published config the round did not run OK, or disproved since, leaves the fastest shown
    assert Config.from_json(round_winner(final, published=Config(mode="ok", BLOCK=64)).config_json) == fastest
    assert Config.from_json(round_winner(final, {kept}, kept).config_json) == fastest


def _step_aside_for(ctx: StudyContext, earlier: optuna.Trial) -> Config:
    """Ask a second trial of ``earlier``'s config and prune it as the trial loop does a twin of one in flight
    (status DUPLICATE, ``duplicate_of`` the earlier's number); the config."""
    from tuner.driver import optuna_access

    config = ctx.space.suggest(earlier)
    ctx.study.enqueue_trial(config.to_dict(), skip_if_exists=False)
    twin = optuna_access.ask(ctx.study)
    assert ctx.space.suggest(twin) == config
    twin.set_user_attr("status", "DUPLICATE")
    twin.set_user_attr("duplicate_of", earlier.number)
    ctx.study.tell(twin, state=optuna.trial.TrialState.PRUNED)
    return config


def test_a_config_whose_twin_failed_unmeasured_is_not_settled(tmp_path, measurer: Measurer) -> None:  # type: ignore[no-untyped-def]
    """A trial that stepped aside for a twin in flight counts as settled only while that twin does: a twin
    that then failed without a measurement (its retries spent, or a store failure without heartbeats) and was
    not queued again leaves the config to be asked again, not settled for ever unmeasured."""
    from tuner.driver import optuna_access
    from tuner.driver.study import settled_params

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    ctx = open_study(NAME, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=3)
    held = optuna_access.ask(ctx.study)
    config = _step_aside_for(ctx, held)
    # in flight on a live worker (heartbeats on): settled; its process gone (without heartbeats): not
    assert config.to_dict() in settled_params(ctx.study, heartbeats=True, waiting=False)
    assert config.to_dict() not in settled_params(ctx.study, heartbeats=False, waiting=False)
    ctx.study.tell(held, state=optuna.trial.TrialState.FAIL)  # failed, nothing stored, not queued again
    assert config.to_dict() not in settled_params(ctx.study, heartbeats=True, waiting=False)
