"""``/v1/studies``: list (filters, paging), one study (summary, final round, failures), its measurements
(paged, sorted, status filter), importance; bad input answered 404/422 with field messages; same auth as
every read. On SQLite and PostgreSQL, through a real server."""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.servers import READ, TOKENS, WORKER, auth, thread_server
from tests.fixtures.sweeps import NAME, TRIALS, store_sweep
from tuner import db
from tuner.api.settings import ApiSettings


def _settings(url: str, **kw: object) -> ApiSettings:
    return ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False, **kw)  # type: ignore[arg-type]


def test_studies_list_detail_and_trials(db_url: str) -> None:
    store = db.Store.open(db_url)
    first = store_sweep(store, shape={"n": 256})
    second = store_sweep(store, shape={"n": 1024}, device_name="other-cpu", version="2")
    with thread_server(_settings(db_url), store) as base, httpx.Client(base_url=base, timeout=30) as http:
        page = http.get("/v1/studies").json()
        assert page["total"] == 2 and [s["id"] for s in page["items"]] == [second.study_id, first.study_id]
        s = next(s for s in page["items"] if s["id"] == first.study_id)
        assert s["trials"] == 8 and s["invalid"] == 1 and s["failed"] == 4  # 9 trials, 1 INVALID, 4 OK
        assert s["statuses"] == {"OK": 4, "WRONG_RESULT": 2, "INVALID": 1, "COMPILE_ERROR": 1, "RUNTIME_ERROR": 1}
        assert s["best_us"] == 19.0 and s["best_config"] == {"BLOCK": 256, "mode": "ok"}
        assert s["fastest_trial_us"] == 20.0 and s["page"] == f"/ui/studies/{first.study_id}"
        assert s["label"] == f"n=256 · {NAME} v1 · test-cpu" and s["shape"] == {"n": 256}

        for params, expected in (
            ({"device_name": "other-cpu"}, [second.study_id]),
            ({"version": "1"}, [first.study_id]),
            ({"shape": "n=1024"}, [second.study_id]),
            ({"template": NAME, "shape": "n=256"}, [first.study_id]),
            ({"device": "cuda"}, []),
            ({"template": "nope"}, []),
            ({"limit": 1, "offset": 1}, [first.study_id]),
        ):
            got = http.get("/v1/studies", params=params).json()
            assert [x["id"] for x in got["items"]] == expected, params
        assert http.get("/v1/studies", params={"limit": 1}).json()["total"] == 2

        detail = http.get(f"/v1/studies/{first.study_id}").json()
        assert [m["candidate"] for m in detail["final_round"]] == ["config", "comparator:torch", "default"]
        assert detail["final_round"][1]["ratio"] == pytest.approx(30 / 19)
        assert detail["default_us"] == 38.0 and detail["best_measurement_id"] == first.best_id
        assert detail["fingerprint_info"]["libraries"]["triton"] == "3.6" and detail["timer"] == "cpu-wall"
        failures = {(f["status"], f["reason"]): f["count"] for f in detail["failures"]}
        assert failures[("WRONG_RESULT", "y: relative error 0.41 > 1e-06")] == 2
        assert failures[("RUNTIME_ERROR", "RuntimeError: injected launch failure")] == 1  # first line only

        trials = http.get(f"/v1/studies/{first.study_id}/trials", params={"limit": 100}).json()
        assert trials["total"] == len(TRIALS) and [m["trial_number"] for m in trials["items"]] == list(range(9))
        fastest = http.get(f"/v1/studies/{first.study_id}/trials", params={"sort": "median_us", "limit": 3}).json()
        assert [m["median_us"] for m in fastest["items"]] == [20.0, 25.0, 40.0]
        slowest = http.get(f"/v1/studies/{first.study_id}/trials", params={"sort": "-median_us"}).json()
        assert slowest["items"][0]["median_us"] == 55.0 and slowest["items"][-1]["median_us"] is None
        failed = http.get(f"/v1/studies/{first.study_id}/trials",
                          params=[("status", "WRONG_RESULT"), ("status", "compile_error")]).json()
        assert failed["total"] == 3 and {m["status"] for m in failed["items"]} == {"WRONG_RESULT", "COMPILE_ERROR"}
        paged = [http.get(f"/v1/studies/{first.study_id}/trials", params={"limit": 4, "offset": o,
                                                                          "sort": "status"}).json()["items"]
                 for o in (0, 4, 8)]
        assert sorted(m["id"] for p in paged for m in p) == sorted(m["id"] for m in trials["items"])
        finals = http.get(f"/v1/studies/{first.study_id}/trials", params={"role": "final"}).json()
        assert finals["total"] == 3
        assert http.get(f"/v1/studies/{first.study_id}/trials", params={"role": "all"}).json()["total"] == 12


def test_studies_by_activity_put_the_study_measured_last_first(db_url: str) -> None:
    """``order=activity`` (the overview's live list): the study with the latest measurement first, whatever
    its age; ``newest`` (the default) keeps the newest study first; any other order is a 422."""
    from tuner.frozen import Config

    store = db.Store.open(db_url)
    older = store_sweep(store, shape={"n": 256})
    newer = store_sweep(store, shape={"n": 1024})
    with store.session() as session:  # the older study is measured again, after the newer one's trials
        db.add_measurement(session, study_id=older.study_id, role="trial", candidate="config",
                           config_json=Config({"mode": "ok", "BLOCK": 64}).to_json(), status="OK", reason=None,
                           round_id=None, trial_number=99, errors_json={"y": 1e-7}, median_us=30.0, p20_us=29.0,
                           p80_us=31.0, n_samples=5, timer="cpu-wall")
    with thread_server(_settings(db_url), store) as base, httpx.Client(base_url=base, timeout=30) as http:
        def ids(**params: object) -> list[int]:
            return [s["id"] for s in http.get("/v1/studies", params=params).json()["items"]]

        assert ids() == [newer.study_id, older.study_id]
        assert ids(order="activity") == [older.study_id, newer.study_id]
        assert ids(order="activity", limit=1) == [older.study_id]
        bad = http.get("/v1/studies", params={"order": "oldest"})
        assert bad.status_code == 422 and "order" in bad.text


def test_the_shape_filter_matches_dims_exactly_and_case_sensitively_on_every_database(db_url: str) -> None:
    """``shape=`` answers the same on SQLite and PostgreSQL: a dim's name and value as the template writes
    them (SQLite's LIKE ignored case: ``n=16`` matched ``N=16`` there and not on PostgreSQL), a whole value
    (``N=1`` is not ``N=16``), ``%`` and ``_`` taken as written; true/false in any case."""
    store = db.Store.open(db_url)
    ids = {name: store_sweep(store, shape=shape, template="other").study_id for name, shape in (
        ("N16", {"N": 16, "dtype": "bfloat16", "causal": True}),
        ("n16", {"n": 16, "dtype": "BFloat16", "causal": False}),
        ("N32", {"N": 32, "dtype": "float_16", "causal": True}),
        ("N32x", {"N": 32, "dtype": "floatx16", "causal": False}),
    )}
    with thread_server(_settings(db_url), store) as base, httpx.Client(base_url=base, timeout=30) as http:
        for shape, expected in (
            ("N=16", ["N16"]), ("n=16", ["n16"]), ("N=1", []), ("N=16,dtype=bfloat16", ["N16"]),
            ("dtype=bfloat16", ["N16"]), ("dtype=BFloat16", ["n16"]), ("dtype=BFLOAT16", []),
            ("dtype=float_16", ["N32"]), ("dtype=float%", []), ("dtype=%", []), ("N=32", ["N32x", "N32"]),
            ("causal=TRUE", ["N32", "N16"]), ("n=16,causal=False", ["n16"]), ("N=16,causal=false", []),
        ):
            got = http.get("/v1/studies", params={"shape": shape}).json()
            assert [x["id"] for x in got["items"]] == [ids[n] for n in expected], shape
            assert got["total"] == len(expected), shape
    store.close()


def test_importance_counts_and_weighs_each_config_once(db_url: str) -> None:
    """A config told again (measured before: its stored time told once more, ``duplicate_of``) is one config:
    ``trials`` counts distinct configs and the importances are those of each config once (the repeats of the
    fastest config would fill the top 10%); too few distinct configs is the 'needs at least' note however
    many times they were told."""
    import optuna

    store = db.Store.open(db_url)
    many, few = store_sweep(store, shape={"n": 256}), store_sweep(store, shape={"n": 512})
    blocks = optuna.distributions.CategoricalDistribution([16, 32, 64, 128, 256])
    modes = optuna.distributions.CategoricalDistribution(["a", "b"])

    def trial(block: int, mode: str, again: bool = False) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(
            params={"BLOCK": block, "mode": mode}, distributions={"BLOCK": blocks, "mode": modes},
            value=block / 16 + (0.5 if mode == "b" else 0.0), user_attrs={"duplicate_of": 0} if again else {})

    distinct = [trial(b, m) for b in (16, 32, 64, 128, 256) for m in ("a", "b")]
    told = distinct + [trial(32, "b", again=True)] * 6 + [trial(16, "a", again=True)] * 4
    sweeps = {}
    for sweep, trials in ((many, told), (few, [*distinct[:3], *distinct[:3], distinct[1]])):
        name = store.get_study(study_id=sweep.study_id).name  # type: ignore[union-attr]
        study = optuna.create_study(study_name=name, storage=store.optuna_storage(), direction="minimize")
        study.add_trials(trials)
        sweeps[sweep.study_id] = study
    alone = optuna.create_study(direction="minimize")
    alone.add_trials(distinct)
    evaluator = optuna.importance.PedAnovaImportanceEvaluator
    expected = optuna.importance.get_param_importances(alone, evaluator=evaluator(), normalize=True)
    repeated = optuna.importance.get_param_importances(sweeps[many.study_id], evaluator=evaluator(),
                                                       normalize=True)
    assert repeated != pytest.approx(expected)  # what the answer was: the repeats change the figures
    with thread_server(_settings(db_url), store) as base, httpx.Client(base_url=base, timeout=60) as http:
        got = http.get(f"/v1/studies/{many.study_id}/importance").json()
        assert got["trials"] == 10 and got["importances"] == pytest.approx(expected), got
        assert list(got["importances"]) == list(expected)  # most important first
        short = http.get(f"/v1/studies/{few.study_id}/importance").json()
        assert short["trials"] == 3 and short["importances"] == {}, short
        assert short["note"] == "needs at least 4 distinct configs measured OK (3 so far)"
    store.close()


def test_studies_bad_input_and_auth(tmp_path: object) -> None:
    url = db.sqlite_url(f"{tmp_path}/t.db")
    store = db.Store.open(url)
    sweep = store_sweep(store)
    with thread_server(_settings(url), store) as base, httpx.Client(base_url=base, timeout=30) as http:
        for path, params, status, loc in (
            ("/v1/studies/999", {}, 404, ["path", "study_id"]),
            ("/v1/studies/999/trials", {}, 404, ["path", "study_id"]),
            ("/v1/studies/999/importance", {}, 404, ["path", "study_id"]),
            ("/v1/studies/abc", {}, 422, ["path", "study_id"]),
            ("/v1/studies", {"shape": "n"}, 422, ["query", "shape"]),
            ("/v1/studies", {"template": NAME, "shape": "m=3"}, 422, ["query", "shape"]),
            ("/v1/studies", {"limit": 0}, 422, ["query", "limit"]),
            ("/v1/studies", {"device": "tpu"}, 422, ["query", "device"]),
            (f"/v1/studies/{sweep.study_id}/trials", {"status": "FINE"}, 422, ["query", "status", 0]),
            (f"/v1/studies/{sweep.study_id}/trials", {"sort": "speed"}, 422, ["query", "sort"]),
            (f"/v1/studies/{sweep.study_id}/trials", {"role": "x"}, 422, ["query", "role"]),
            (f"/v1/studies/{sweep.study_id}/trials", {"offset": -1}, 422, ["query", "offset"]),
            # past 64 bits: the field's own error, not the store's refusal of the value
            (f"/v1/studies/{sweep.study_id}/trials", {"offset": 2**63}, 422, ["query", "offset"]),
            ("/v1/studies", {"offset": 2**63}, 422, ["query", "offset"]),
        ):
            r = http.get(path, params=params)
            assert r.status_code == status, (path, params, r.text)
            body = r.json()
            assert isinstance(body["detail"], list) and body["detail"][0]["loc"] == loc, (path, body)
            assert body["detail"][0]["msg"] and "Traceback" not in r.text
    with thread_server(_settings(url, read_requires_token=True), store) as base:
        assert httpx.get(f"{base}/v1/studies").status_code == 401
        assert httpx.get(f"{base}/v1/studies", headers=auth(WORKER)).status_code == 403
        for path in ("/v1/studies", f"/v1/studies/{sweep.study_id}", f"/v1/studies/{sweep.study_id}/trials"):
            assert httpx.get(f"{base}{path}", headers=auth(READ)).status_code == 200, path
