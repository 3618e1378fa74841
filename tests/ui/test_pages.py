"""Every page and every asset over a real server (no browser): pages render with the store's figures, errors
render as pages (404, 422 naming the field) without a traceback, and nothing references another host: no
external URL in any page's HTML or in the pages' CSS/JS, and every page carries a Content-Security-Policy
that lets the browser load nothing from elsewhere (which covers the vendored Swagger UI, ReDoc and plotly.js
bundles, whose source holds URLs such as XML namespaces and links; the browser test records requests)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fixtures.servers import TOKENS, thread_server
from tests.fixtures.statements import sent_statements
from tests.fixtures.sweeps import NAME, StoredSweep, store_sweep
from tuner import db
from tuner.api.main import create_app
from tuner.api.settings import ApiSettings

FETCH_DIRECTIVES = ("default-src", "script-src", "style-src", "img-src", "font-src", "connect-src", "worker-src")
LOCAL_SOURCES = {"'self'", "'unsafe-inline'", "data:", "blob:", "'none'"}


class Refs(HTMLParser):
    """Every URL an HTML document refers to: attributes that load or link, and url(...) in inline styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name in ("src", "href", "action", "poster", "data", "srcset", "formaction"):
                self.urls.append(value)
            if value and name == "style":
                self.urls += re.findall(r"url\(\s*['\"]?([^'\")]+)", value)


def external(url: str) -> bool:
    parts = urlsplit(url)
    return url.startswith("//") or (parts.scheme not in ("", "data", "blob") and bool(parts.netloc or parts.scheme))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, StoredSweep, int]]:
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry

    registry.register(NAME, TUNABLE_REF)
    store = db.Store.open(db.sqlite_url(tmp_path_factory.mktemp("pages") / "t.db"))
    sweep = store_sweep(store)
    store_sweep(store, shape={"n": 1024})
    with store.session() as session:
        job = db.create_job(session, template=NAME, template_version="1", backend="triton", device_kind="cpu",
                            device_name=None, trials=4, sampler="random", samples=3, candidate_timeout_s=60,
                            tasks=[("n=256", "n=256", '{"n":256}')])
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base:
        yield base, sweep, job.id


def _pages(sweep: StoredSweep, job_id: int) -> list[str]:
    return ["/", f"/ui/templates/{NAME}", f"/ui/studies/{sweep.study_id}", f"/ui/jobs/{job_id}",
            f"/ui/compare?study={sweep.study_id}&study={sweep.study_id + 1}", "/ui/compare", "/ui/login",
            "/docs", "/redoc"]


def test_pages_render_the_store(served: tuple[str, StoredSweep, int]) -> None:
    base, sweep, job_id = served
    with httpx.Client(base_url=base, timeout=60) as http:
        overview = http.get("/").text
        assert f"/ui/studies/{sweep.study_id}" in overview and NAME in overview and f"/ui/jobs/{job_id}" in overview
        study = html.unescape(http.get(f"/ui/studies/{sweep.study_id}").text)
        assert "19.00 µs" in study and "38.00 µs" in study  # the published best and the default (final round)
        assert "RuntimeError: injected launch failure" in study and "y: relative error 0.41" in study
        assert '"BLOCK": 256' in study and "BLOCK=256, mode='ok'" in study  # JSON and launch kwargs
        template = http.get(f"/ui/templates/{NAME}").text
        assert "2.00×" in template  # default 38 µs / best 19 µs
        assert "torch µs" in template and 'class="match m-exact"' in template
        compare = http.get("/ui/compare", params=[("study", sweep.study_id), ("study", sweep.study_id + 1)]).text
        assert "n=1024" in compare and "plot-ecdf" in compare


def test_the_template_page_asks_the_lookup_as_the_api_does(served: tuple[str, StoredSweep, int]) -> None:
    """The template page's form (``shape.<dim>=…``) shows what ``GET /v1/best`` serves for any shape on the
    page's device: exact for a tuned shape, nearest with the repair the lookup made, the default on a kind
    with no entry, the API's 422 message inline for a shape the template rejects (the page still renders; a
    dim sent twice, which the form never does, gets the error page), and a link to the same API call,
    whose answer is the page's. Unsent, the form holds the first row's shape (n=256: rows go by their dims'
    numbers, n=256 before n=1024, not as text)."""
    base = served[0]
    page = f"/ui/templates/{NAME}"

    def ask(query: str, status: int = 200) -> str:
        r = httpx.get(f"{base}{page}?device=test-cpu&{query}", timeout=60)
        assert r.status_code == status and r.headers["content-type"].startswith("text/html"), r.text[:300]
        return html.unescape(r.text)

    unsent = html.unescape(httpx.get(base + page, timeout=60).text)
    assert 'name="shape.n" value="256"' in unsent and 'id="ask-answer"' not in unsent
    rows = re.findall(r'<tr[^>]*data-shape="([^"]+)"', unsent) or re.findall(r'>n=(\d+)<', unsent)
    assert rows and rows.index(next(r for r in rows if r.endswith("256"))) < rows.index(
        next(r for r in rows if r.endswith("1024"))), rows
    exact = ask("shape.n=256")
    assert 'class="match m-exact">exact' in exact and "19.00 µs" in exact and "BLOCK=256" in exact
    near = ask("shape.n=128&kind=cpu")
    assert 'class="match m-nearest">nearest' in near and "distance 1" in near
    assert "<code>BLOCK 256 → 128</code>" in near and "repaired the config of the entry for n=256" in near
    api = re.search(r'href="(/v1/best\?[^"]+)"', near)
    assert api is not None and "shape=n%3D128" in api.group(1) and "device_name=test-cpu" in api.group(1)
    answer = httpx.get(base + api.group(1), timeout=60).json()
    assert (answer["match"], answer["config"]) == ("nearest", {"mode": "ok", "BLOCK": 128})
    npu = ask("shape.n=64&kind=npu")
    assert npu.count('class="match m-default">default') == 1  # nothing measured on npu
    npu_api = re.search(r'href="(/v1/best\?[^"]+)"', npu)  # the page's device name is a cpu's: not sent for npu
    assert npu_api is not None and "device=npu" in npu_api.group(1) and "device_name" not in npu_api.group(1)
    rejected = ask("shape.n=x", 422)
    assert 'id="ask-error"' in rejected and "shape dim n: expected an integer, got 'x'" in rejected
    assert 'id="shapes"' in rejected  # the rest of the page is there
    assert "shape dim n is given twice" in ask("shape.n=1&shape.n=2", 422)


def test_the_lookup_form_reads_dims_as_the_api_does_and_queues_nothing(tmp_path: Path) -> None:
    """A template with required, defaulted, bool and choice dims (the TileLang chunk cumsum, whose spec and
    space the API loads without its kernels) on two devices: blank fields take the dims' defaults (shown as
    placeholders and blank options), a bool sent as 1 shows true, a value outside the choices stays shown
    (marked invalid) beside the API's message, a comma inside a field is read as the API reads ``shape=`` (the
    page and its link answer alike), and a foreign answer (another device's entry) queues no re-verification
    from the page, while the same question to the API does."""
    from tests.fixtures.servers import publish
    from tuner import registry

    name = "mamba2_chunk_cumsum_tilelang"
    spec = registry.spec(name)
    default = spec.space().default.to_dict()
    near = spec.make_shape({"B": 1, "S": 4096, "H": 48, "has_bias": True, "dtype": "float16"}).to_dict()
    other = spec.make_shape({"B": 8, "S": 2048, "H": 64, "has_bias": True, "dtype": "bfloat16"}).to_dict()
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    publish(store, name, near, default, 2.5, device_kind="cuda", device_name="dev-a", version=spec.version)
    publish(store, name, other, default, 4.4, device_kind="cuda", device_name="dev-b", version=spec.version)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    app = create_app(settings, store)
    foreign_answers: list[Any] = []  # what BestService reports to on_foreign (tuner serve queues re-verification)
    app.state.best.on_foreign = lambda request, answer: foreign_answers.append(answer)
    with thread_server(settings, store, app=app) as base, httpx.Client(base_url=base, timeout=60) as http:
        page = f"/ui/templates/{name}?device=dev-a&kind=cuda&"

        def ask(dims: str, status: int = 200) -> str:
            r = http.get(page + dims)
            assert r.status_code == status, r.text[:300]
            return html.unescape(r.text)

        def api_of(text: str) -> dict[str, Any]:
            link = re.search(r'href="(/v1/best\?[^"]+)"', text)
            assert link is not None
            return dict(http.get(html.unescape(link.group(1))).json())

        exact = ask("shape.B=1&shape.S=4096&shape.H=48&shape.Q=&shape.has_bias=1&shape.dtype=float16&shape.softplus=")
        assert 'class="match m-exact">exact' in exact
        assert '<option value="true" selected>true</option>' in exact  # has_bias=1, as the dim reads it
        assert 'name="shape.Q" value="" size="7" inputmode="numeric" placeholder="default 256">' in exact
        assert '<option value="" selected>default (true)</option>' in exact  # softplus left to its default
        assert 'name="shape.B" value="1" size="7" inputmode="numeric" required>' in exact
        wrong = ask("shape.B=1&shape.S=4096&shape.H=48&shape.dtype=int8", 422)
        assert '<option value="int8" selected>int8 (invalid)</option>' in wrong
        assert "shape dim dtype: expected one of float16, bfloat16, float32, got 'int8'" in wrong
        comma = ask("shape.B=1&shape.S=4096&shape.H=48,dtype=bfloat16&shape.has_bias=true")
        theirs = api_of(comma)
        assert theirs["match"] == "nearest" and theirs["shape"]["dtype"] == "bfloat16" and theirs["distance"] == 1
        assert 'class="match m-nearest">nearest' in comma and "distance 1<" in comma

        foreign = ask("shape.B=8&shape.S=2048&shape.H=64&shape.has_bias=true&shape.dtype=bfloat16")
        assert "on dev-b" in foreign and "nothing measured on 'dev-a'" in foreign  # another device's config
        assert foreign_answers == []  # a page view reports nothing (no re-verification queued by a GET page)
        assert api_of(foreign)["device_name"] == "dev-b"
        assert len(foreign_answers) == 1 and foreign_answers[0].entry.device_name == "dev-b"  # the API does
    store.close()


def test_pages_show_what_tuner_verify_found_as_the_report_and_the_api_do(tmp_path: Path) -> None:
    """The template page marks each row's best with its study's latest verification (a flagged drift as the
    report's '⚠ drift +8.0% (verify)', else '✓ reproduced'), the study page its published best; the API's
    answer says the same drift; the overview lists a verify job by its shapes and processes. Comparator columns
    come in numeric order; a docstring's ``literal`` is code."""
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry
    from tuner.api.ui.plots import natural_key

    registry.register(NAME, TUNABLE_REF)
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    drifted, steady = store_sweep(store), store_sweep(store, shape={"n": 1024})
    for sweep, median in ((drifted, 19.0 * 1.08), (steady, 19.0 * 0.99)):
        store.add_verification(study_id=sweep.study_id, config_json='{"BLOCK": 256, "mode": "ok"}', stored_us=19.0,
                               median_us=median, low_us=median, high_us=median, drift=median / 19.0 - 1,
                               tolerance=0.03, flagged=abs(median / 19.0 - 1) > 0.03, processes=2,
                               figures=[{"process": 1, "candidates": []}, {"process": 2, "candidates": []}],
                               device_kind="cpu", device_name="test-cpu", fingerprint_hash="f", fingerprint_json="{}")
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=60) as http:
        page = http.get(f"/ui/templates/{NAME}").text
        shapes = page.split('id="shapes"')[1].split("</table>")[0]  # the best-per-shape table, one row per study
        cells = {int(m.group(1)): m.group(0) for m in re.finditer(r'<a href="/ui/studies/(\d+)".*?</tr>', shapes, re.S)}
        assert "⚠ drift +8.0% (verify)" in cells[drifted.study_id] and "reproduced" not in cells[drifted.study_id]
        assert "✓ reproduced -1.0%" in cells[steady.study_id] and "⚠" not in cells[steady.study_id]
        assert "20.52 µs, median over 2 fresh processes, against 19.00 µs stored (tolerance ±3%)" in html.unescape(page)
        study = http.get(f"/ui/studies/{drifted.study_id}").text
        assert "⚠ drift +8.0% (verify)" in study.split('id="kpi-best"')[1].split("</div>")[0]
        answer = http.get("/v1/best", params={"template": NAME, "device": "cpu", "n": 256}).json()
        assert answer["verification"]["flagged"] and round(100 * answer["verification"]["drift"], 1) == 8.0
        assert any("drifted +8.0%" in note for note in answer["notes"])
        doc = http.get("/ui/templates/mamba2_chunk_cumsum").text
        assert "<code>_chunk_cumsum_fwd</code>" in doc and "``" not in doc
        # a verify job on the overview: its shapes and processes, not a '0 / 0' trials bar; no best yet is '–'
        check = store.create_verify_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                                        device_name=None, tasks=[("n=256", "n=256", '{"n":256}')], processes=3)
        row = http.get("/").text.split(f'<tr data-job="{check.id}">')[1].split("</tr>")[0]
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", row)).split())
        assert "verify: 0 / 1 shape(s) re-measured in 3 processes" in text and "0 / 0" not in text, text
        assert text.endswith("– 0") and "µs" not in text, text  # best so far '–', then 0 workers
    store.close()
    names = ["ceiling-block1024", "ceiling-block512", "mamba_ssm-fp32-bh16", "mamba_ssm-fp32-bh2", "torch"]
    assert sorted(names, key=natural_key) == ["ceiling-block512", "ceiling-block1024", "mamba_ssm-fp32-bh2",
                                              "mamba_ssm-fp32-bh16", "torch"]


def test_compare_says_which_study_is_faster(tmp_path: Path) -> None:
    """'best / first's best' is said and coloured for the column's study: 2.00× 🔴 slower than #1, 0.50× 🟢
    faster than #2 (it was coloured for the first study: a slower second study read 🟢)."""
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry
    from tuner.frozen import Config

    registry.register(NAME, TUNABLE_REF)
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    fast, slow = store_sweep(store), store_sweep(store, shape={"n": 1024})
    with store.session() as session:  # the second study's best is republished at 38 µs
        m = db.add_measurement(session, study_id=slow.study_id, role="final", candidate="config",
                               config_json=Config({"mode": "ok", "BLOCK": 512}).to_json(), status="OK", reason=None,
                               round_id="r2", trial_number=None, errors_json={"y": 1e-7}, median_us=38.0,
                               p20_us=37.0, p80_us=39.0, n_samples=5, timer="cpu-wall")
        db.publish_best(session, study_id=slow.study_id, measurement_id=m.id)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=60) as http:
        def row(first: int, second: int) -> str:
            page = http.get("/ui/compare", params=[("study", first), ("study", second)]).text
            cells = page.split("<th>best / first's best")[1].split("</th>", 1)[1].split("</tr>")[0]
            return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cells)).split())

        assert row(fast.study_id, slow.study_id) == f"– 2.00× 🔴 slower than #{fast.study_id}"
        assert row(slow.study_id, fast.study_id) == f"– 0.50× 🟢 faster than #{slow.study_id}"
    store.close()


def test_the_template_page_reads_the_store_as_often_for_12_shapes_as_for_3(tmp_path: Path) -> None:
    """The template page's store reads do not grow with its rows (what final rounds and verifications
    disproved was three reads per row: ~1.5 s at 300 shapes on PostgreSQL); a row whose best a verification on
    its device disproved shows the next fastest config of its round instead."""
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry
    from tuner.api.best_service import BestService
    from tuner.api.catalog import Catalog
    from tuner.api.deps import StoreProvider
    from tuner.api.ui import views
    from tuner.store.records import VERIFIED_LABEL

    registry.register(NAME, TUNABLE_REF)

    def selects(shapes: int) -> tuple[int, list[views.ShapeRow]]:
        store = db.Store.open(db.sqlite_url(tmp_path / f"{shapes}.db"))
        sweeps = [store_sweep(store, shape={"n": 256 * (i + 1)}) for i in range(shapes)]
        wrong = [{"process": 1, "candidates": [{"label": VERIFIED_LABEL, "status": "WRONG_RESULT"}]}]
        store.add_verification(study_id=sweeps[0].study_id, config_json='{"BLOCK": 256, "mode": "ok"}',
                               stored_us=19.0, median_us=None, low_us=None, high_us=None, drift=None, tolerance=0.03,
                               flagged=False, processes=1, figures=wrong, device_kind="cpu", device_name="test-cpu",
                               fingerprint_hash="f", fingerprint_json="{}")
        catalog = Catalog()
        best = BestService(catalog, StoreProvider(None, store), ttl_s=60.0, max_entries=100)
        views.template_page(store, catalog, best, NAME, None)  # the lookup's cached entries, read once
        try:
            with sent_statements(store.engine) as statements:
                page = views.template_page(store, catalog, best, NAME, None)
        finally:
            store.close()
        assert len(page["rows"]) == shapes
        by_study = {row.study.id: row for row in page["rows"]}
        return len(statements), [by_study[sweep.study_id] for sweep in sweeps]

    few, rows = selects(3)
    many, _ = selects(12)
    assert few == many, (few, many)
    assert (rows[0].best_us, rows[0].best_config) == (38.0, {"mode": "ok", "BLOCK": 64})  # disproved: the default
    assert (rows[1].best_us, rows[1].best_config) == (19.0, {"mode": "ok", "BLOCK": 256})


@pytest.mark.parametrize(("path", "status", "message"), [
    ("/ui/studies/999", 404, "no study 999"),
    ("/ui/jobs/999", 404, "no job 999"),
    ("/ui/templates/nope", 404, "unknown template &#39;nope&#39;"),
    ("/ui/nope", 404, "nothing at /ui/nope"),
    ("/ui/studies/abc", 422, "study_id: Input should be a valid integer"),
    ("/ui/compare?study=x", 422, "study.0: Input should be a valid integer"),
    # ids beyond 64 bits: the page names the field, never the store's raw JSON refusal
    ("/ui/studies/9223372036854775808", 422, "study_id: Input should be less than or equal to 9223372036854775807"),
    ("/ui/jobs/99999999999999999999", 422, "job_id: Input should be less than or equal to 9223372036854775807"),
    ("/ui/compare?study=1&study=9223372036854775808", 422, "study.1: Input should be a study id from 1 to"),
    # the form's empty select ("none chosen") is left out: the page to choose from, not an error
    ("/ui/compare?study=1&study=", 200, 'class="card compare-form"'),
    ("/ui/compare?study=&study=", 200, 'class="card compare-form"'),
    ("/ui/studies/9223372036854775807", 404, "no study 9223372036854775807"),
    (f"/ui/templates/{NAME}?device=nowhere", 404, "no study of fault_vector_scale_tunable on &#39;nowhere&#39;"),
])
def test_errors_are_pages(served: tuple[str, StoredSweep, int], path: str, status: int, message: str) -> None:
    r = httpx.get(served[0] + path)
    assert r.status_code == status and r.headers["content-type"].startswith("text/html"), r.text[:300]
    assert message in r.text and "Traceback" not in r.text


def test_a_value_the_store_refuses_is_a_page_on_pages_and_json_elsewhere(tmp_path: Path) -> None:
    """A UserInputError subclass (here the store refusing a value) has its own JSON handler; on a page it renders
    the 422 page, as every other error does, not the API's JSON."""
    from tuner.api.main import create_app
    from tuner.errors import RecordConflictError, RecordRejectedError

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    app = create_app(settings, store)

    def refuse() -> None:
        raise RecordRejectedError("the store refused a value: too large")

    def conflict() -> None:
        raise RecordConflictError("job 3 is already done")

    for prefix in ("/ui", "/v1"):
        app.add_api_route(f"{prefix}/refuse", refuse)
        app.add_api_route(f"{prefix}/conflict", conflict)
    with thread_server(settings, store, app=app) as base:
        page = httpx.get(base + "/ui/refuse")
        assert page.status_code == 422 and page.headers["content-type"].startswith("text/html"), page.text[:300]
        assert "Malformed request" in page.text and "the store refused a value: too large" in page.text
        page = httpx.get(base + "/ui/conflict")
        assert page.status_code == 409 and page.headers["content-type"].startswith("text/html"), page.text[:300]
        assert "job 3 is already done" in page.text
        api = httpx.get(base + "/v1/refuse")
        assert api.status_code == 422 and api.json()["detail"][0]["msg"] == "the store refused a value: too large"
        assert httpx.get(base + "/v1/conflict").json() == {"detail": "job 3 is already done"}
    store.close()


def test_no_page_or_asset_references_another_host(served: tuple[str, StoredSweep, int]) -> None:
    base, sweep, job_id = served
    assets: set[str] = set()
    with httpx.Client(base_url=base, timeout=60) as http:
        for path in [*_pages(sweep, job_id), "/ui/studies/999"]:
            r = http.get(path)
            assert r.status_code in (200, 404), path
            policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
            for directive in FETCH_DIRECTIVES:
                assert set(policy[directive].split()) <= LOCAL_SOURCES, (path, directive, policy[directive])
            refs = Refs()
            refs.feed(r.text)
            assert not [u for u in refs.urls if external(u)], path
            assert not re.findall(r"https?://", r.text.replace(base, "")), path
            assets |= {u for u in refs.urls if u.startswith(("/ui/static/", "/ui/vendor/"))}
        assert {a.split("?")[0] for a in assets} >= {"/ui/static/ui.css", "/ui/static/ui.js",
                                                     "/ui/vendor/plotly.min.js", "/ui/vendor/swagger-ui-bundle.js",
                                                     "/ui/vendor/redoc.standalone.js", "/ui/vendor/swagger-ui.css"}
        for asset in assets:
            r = http.get(asset)
            assert r.status_code == 200 and r.content, asset
            # every asset URL names its content's digest: a browser may keep it for a year
            assert "?v=" in asset and "immutable" in r.headers.get("cache-control", ""), asset
            if asset.startswith("/ui/static/") or asset.split("?")[0].endswith(".css"):
                text = r.text
                assert not re.findall(r"url\(\s*['\"]?(?:https?:)?//", text), asset  # CSS loads
                assert not re.findall(r"@import\s+(?:url\()?\s*['\"]?(?:https?:)?//", text), asset
            if asset.startswith("/ui/static/"):
                assert not re.findall(r"https?://", r.text), asset  # our own files name no host at all
    assert httpx.get(base + "/ui/vendor/nope.js").status_code == 404


def test_pages_need_the_read_token_when_reads_do(tmp_path: Path) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False,  # type: ignore[arg-type]
                           read_requires_token=True)
    read = next(t for t, scopes in TOKENS.items() if scopes == ["read"])
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
        first = http.get("/", follow_redirects=False)
        assert first.status_code == 303 and first.headers["location"] == "/ui/login?next=/"
        refused = http.post("/ui/login", data={"token": "not-a-token", "next": "/"})
        assert refused.status_code == 401 and "unknown token" in refused.text
        signed = http.post("/ui/login", data={"token": read, "next": "https://elsewhere.example/"},
                           follow_redirects=False)
        assert signed.status_code == 303 and signed.headers["location"] == "/"  # never to another host
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age" not in cookie
        assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back
        # Behind a TLS proxy on this host (uvicorn trusts 127.0.0.1's X-Forwarded-Proto) the cookie is Secure.
        tls = httpx.post(f"{base}/ui/login", data={"token": read, "next": "/"}, follow_redirects=False,
                         headers={"x-forwarded-proto": "https"})
        assert tls.status_code == 303 and "Secure" in tls.headers["set-cookie"]
        assert http.get("/").status_code == 200  # the session cookie is sent back
        # The pages' scripts read /v1 with that cookie alone (trials tables, job polling)...
        assert http.get("/v1/jobs", params={"limit": 20}).status_code == 200
        assert http.get("/v1/studies").status_code == 200
        # ...which grants reads only: a submission still needs a bearer token with the submit scope.
        assert http.post("/v1/jobs", json={"template": NAME, "shapes": ["n=256"]}).status_code == 401
        anonymous = httpx.get(f"{base}/v1/jobs")
        assert anonymous.status_code == 401
        # A login form with fields it does not have is refused as such, not a server error.
        odd = http.post("/ui/login", content=b"a=1&b=2&c=3&d=4&e=5",
                        headers={"content-type": "application/x-www-form-urlencoded"})
        assert odd.status_code == 400 and "login" in odd.text


def test_job_page_says_why_it_waits_and_who_gave_its_shape_up(db_url: str) -> None:
    """The job page shows what ``GET /v1/jobs/{id}`` says (the same ``waiting``, each shape's attempts of the
    job's max_attempts with who gave it up, why and when), which live workers advertise its template, and
    the overview what each worker advertises: first every live worker that could take the job gave its shape
    up, then that worker is gone and no live worker advertises the template. Whether each live worker could
    claim a shape is what ``claim_task`` then does (the one claim rule): a worker that gave up one of two
    shapes takes the other; a cancelled job's card is hidden; a 1-trial job whose trial another worker holds
    offers nothing."""
    store = db.Store.open(db_url)
    job = store.create_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                           device_name=None, trials=4, sampler="random", samples=3, candidate_timeout_s=60,
                           tasks=[("n=256", "n=256", '{"n":256}')], max_attempts=2)
    common = {"host": "h", "pid": 1, "device_kind": "cpu", "device_name": "CPU", "device_index": 0,
              "backends": ["triton"], "fingerprint_hash": "f", "fingerprint_json": "{}", "lease_s": 600.0}
    store.register_worker(worker_id="other", templates={"some_other_template": "7"}, **common)  # type: ignore[arg-type]
    store.register_worker(worker_id="w", templates={NAME: "1"}, **common)  # type: ignore[arg-type]
    claim = store.claim_task(worker_id="w", device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None
    store.fail_attempt(task_id=claim.task.id, worker_id="w", reason="DeviceError: <gone>")
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    claim_as = {"device_kind": "cpu", "device_name": "CPU", "backends": ["triton"]}
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=60) as http:
        def page(job_id: int = job.id) -> tuple[dict[str, object], str]:
            served = http.get(f"/v1/jobs/{job_id}").json()
            r = http.get(f"/ui/jobs/{job_id}")
            assert r.status_code == 200, r.text[:300]
            return served, html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r.text)))

        def could_claim(job_id: int) -> dict[str, str]:
            """Each listed worker's 'could claim' cell, and whether the card is shown ('card': 'shown' or 'hidden')."""
            r = http.get(f"/ui/jobs/{job_id}").text
            card = re.search(r'<section class="card" id="candidates-card" ?(hidden)?', r)
            assert card is not None, r[:300]
            cells = re.findall(r'<tr data-worker="([^"]+)">.*?<td class="c-verdict">(.*?)</td>', r, re.S)
            return {"card": card.group(1) or "shown",
                    **{w: html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for w, cell in cells}}

        served, text = page()
        assert served["waiting"] == "every live worker gave n=256 up: w: DeviceError: <gone>", served
        assert f"waiting {served['waiting']}" in text
        (attempt,) = served["tasks"][0]["attempt_reasons"]  # type: ignore[index]
        reason = f"w : DeviceError: <gone> at {attempt['at'][:19].replace('T', ' ')} UTC"
        assert "1 / 2" in text and reason in text
        assert "w h/1 cpu:0 · CPU triton v1 idle" in text  # the worker that could, and why it does not
        assert could_claim(job.id) == {"card": "shown", "w": "no: gave up every open shape (n=256)"}
        assert store.claim_task(worker_id="w", **claim_as) is None

        store.stop_worker(worker_id="w")
        served, text = page()
        assert served["waiting"] == f"no live worker advertises {NAME} version 1", served
        assert f"waiting {served['waiting']}" in text and "1 / 2" in text and reason in text
        assert f"no live worker advertises {NAME} version 1 (1 live worker(s) in all" in text
        overview = html.unescape(http.get("/").text)
        assert "some_other_template&nbsp;v7" in overview.replace("\xa0", "&nbsp;")
        row = re.search(rf'<tr data-job="{job.id}">(.*?)</tr>', overview, re.S)
        assert row is not None and served["waiting"] in row.group(1), overview[:300]  # the overview says why too

        store.cancel_job(job_id=job.id)  # from here on, the jobs below are the only ones open
        store.register_worker(worker_id="v", templates={NAME: "1"}, **common)  # type: ignore[arg-type]
        two = store.create_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                               device_name=None, trials=4, sampler="random", samples=3, candidate_timeout_s=60,
                               tasks=[("a", "n=256", '{"n":256}'), ("b", "n=512", '{"n":512}')])
        first = store.claim_task(worker_id="v", **claim_as)
        assert first is not None and first.task.label == "a"
        store.fail_attempt(task_id=first.task.id, worker_id="v", reason="DeviceError: a")
        assert could_claim(two.id) == {"card": "shown", "v": "yes (1 of 2 open shapes)"}
        second = store.claim_task(worker_id="v", **claim_as)  # as the page said: the shape it did not give up
        assert second is not None and second.task.label == "b"
        store.fail_attempt(task_id=second.task.id, worker_id="v", reason="DeviceError: b")
        assert could_claim(two.id) == {"card": "shown", "v": "no: gave up every open shape (a, b)"}
        assert store.claim_task(worker_id="v", **claim_as) is None

        store.cancel_job(job_id=two.id)
        assert could_claim(two.id) == {"card": "hidden", "v": "no: the job is finished"}

        one = store.create_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                               device_name=None, trials=1, sampler="random", samples=3, candidate_timeout_s=60,
                               tasks=[("n=256", "n=256", '{"n":256}')])
        store.register_worker(worker_id="x", templates={NAME: "1"}, **common)  # type: ignore[arg-type]
        held = store.claim_task(worker_id="x", **claim_as)
        assert held is not None and store.reserve_slot(task_id=held.task.id, worker_id="x") is not None
        taken = "no: every trial of n=256 is taken"
        assert could_claim(one.id) == {"card": "shown", "x": "on it", "v": taken}  # x holds the only slot
        on_it = http.get(f"/ui/jobs/{one.id}").text  # drawn as a yes (it was in a refusal's red)
        assert re.search(r'<tr data-worker="x">.*?<td class="c-verdict"><span class="good">on it</span>', on_it, re.S)
        assert store.claim_task(worker_id="v", **claim_as) is None

        # a verify job's page says how it re-measures, not a sampler's settings
        check = store.create_verify_job(template=NAME, template_version="1", backend="triton", device_kind="cpu",
                                        device_name=None, tasks=[("n=256", "n=256", '{"n":256}')], processes=3,
                                        comparator_processes=1)
        text = html.unescape(http.get(f"/ui/jobs/{check.id}").text)
        assert "3 fresh processes · 100 samples" in text and "comparators in the first 1" in text
        assert "finalists" not in text and "shapes re-measured" in text and "0 / 1" in text
    store.close()


def test_hover_labels_show_stored_text_as_written() -> None:
    """Plotly reads links and styles in hover text: a stored reason or config value is escaped, not markup."""
    from datetime import datetime, timezone

    from tuner.api.ui.plots import trials_figure
    from tuner.results import Status

    m = db.MeasurementRecord(
        id=1, study_id=1, role="trial", round_id=None, candidate="config", trial_number=0,
        config_json='{"mode": "<a href=//x>"}', status=Status.WRONG_RESULT,
        reason='<a href="https://elsewhere.example">click</a> & <b>bold</b>', errors_json="{}", kernels_json="[]",
        median_us=None,
        p20_us=None, p80_us=None, mean_us=None, min_us=None, max_us=None, n_samples=None, timer=None,
        build_s=None, verify_s=None, measure_s=None, worker=None, created_at=datetime.now(timezone.utc))
    figure = json.dumps(trials_figure([m]))
    assert "<a href" not in figure and "&lt;a href" in figure and "&amp; &lt;b&gt;bold" in figure
