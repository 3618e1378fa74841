"""The pages in a real browser (headless Chromium) against a real ``tuner serve`` with its CPU worker, whose
store holds a real sweep (the Triton interpreter, a small shape): what the pages show matches the store, the
trials table filters by status through the API, a running job's page advances without a reload, a job no
worker can take says why it waits, cancelling needs the submit token, and no page makes the browser contact
another host. A screenshot of every page is written under ``$TUNER_TEST_ARTIFACTS/ui`` (default
``.artifacts/ui`` in the repository)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures import browser
from tests.fixtures.processes import ROOT, env, wait_for
from tests.fixtures.servers import auth, free_port, start_serve
from tuner import db

NAME = "fault_vector_scale_tunable"
ARTIFACTS = Path(os.environ.get("TUNER_TEST_ARTIFACTS", ROOT / ".artifacts")) / "ui"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))]


@dataclass
class Served:
    base: str
    url: str
    token: str
    study_id: int
    trials: list[db.MeasurementRecord]
    driver: Any


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("browser")
    url = db.sqlite_url(tmp / "t.db")
    sweep = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", NAME, "--shape", "n=256", "--trials", "10", "--device", "cpu",
         "--samples", "3", "--sampler", "random", "--seed", "1", "--db", url],
        capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    with db.Store.open(url) as store, store.session() as session:
        (study,) = db.list_studies(session, template=NAME)
        trials = db.list_measurements(session, study_id=study.id, role="trial")
    home, port = tmp / "home", free_port()
    serve = start_serve(url, port, "--device", "cpu", home=home, log=tmp / "serve.log")
    base, driver = f"http://127.0.0.1:{port}", None
    try:
        # /healthz answers before the server's CPU worker (a child process) has registered: the tests need it
        token = (home / "token").read_text().strip()
        live = lambda: [w for w in httpx.get(f"{base}/v1/workers", headers=auth(token), timeout=5).json()  # noqa: E731
                        if w["state"] in ("idle", "busy")]
        wait_for(lambda: bool(live()), 120, "the server's CPU worker to register")
        driver = browser.start()
        yield Served(base, url, token, study.id, trials, driver)
    finally:
        if driver is not None:
            driver.quit()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=90)


def _open(s: Served, path: str, shot: str) -> None:
    """Load a page, let its scripts run, screenshot it, and check what the browser requested and logged."""
    s.driver.get_log("browser")  # drain: what earlier pages logged is not this page's
    browser.requested_urls(s.driver)
    s.driver.get(s.base + path)
    _wait(lambda: s.driver.execute_script("return document.readyState") == "complete", 30, f"{path} to load")
    time.sleep(1.0)
    browser.screenshot(s.driver, ARTIFACTS / f"{shot}.png")
    s.driver.set_window_size(1440, 1000)
    sent, blocked = browser.requested_urls(s.driver)
    assert sent and not browser.foreign(sent, s.base) and not blocked, (path, browser.foreign(sent, s.base), blocked)
    errors = [e for e in s.driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, (path, errors)


def test_overview_lists_the_study(served: Served) -> None:
    _open(served, "/", "overview")
    link = served.driver.find_element("css selector", f'#studies a[href="/ui/studies/{served.study_id}"]')
    assert link.text == "n=256"
    assert NAME in served.driver.find_element("id", "templates").text


def test_study_page_plots_every_trial(served: Served) -> None:
    _open(served, f"/ui/studies/{served.study_id}", "study")
    d = served.driver
    traces = d.execute_script("""return document.getElementById('plot-trials').data
        .filter(t => t.meta && t.meta.role === 'trials').map(t => [t.meta.status, t.x.length]);""")
    by_status: dict[str, int] = {}
    for m in served.trials:
        by_status[m.status.value] = by_status.get(m.status.value, 0) + 1
    assert dict(traces) == by_status and sum(n for _, n in traces) == len(served.trials)
    rendered = d.execute_script("return document.querySelectorAll('#plot-trials .point').length")
    assert rendered == len(served.trials)  # every point drawn (plotly draws one path per point)
    ok = sum(1 for m in served.trials if m.ok)
    for i in (1, 2):  # one small plot per parameter (mode, BLOCK), each with every OK trial
        assert d.execute_script(f"return document.getElementById('plot-param-{i}').data[0].x.length") == ok
    _wait(lambda: "computing" not in d.find_element("id", "importance").text, 60, "the importance panel")


def test_trials_table_filters_by_status(served: Served) -> None:
    d = served.driver
    _open(served, f"/ui/studies/{served.study_id}", "study-trials")
    failing = [m.status.value for m in served.trials if not m.ok]
    status = max(set(failing), key=failing.count)
    table = d.find_element("id", "trials")
    _wait(lambda: table.get_attribute("data-loaded") == "1", 30, "the first page of trials")
    # each status chip is drawn in its status's colour, its white label readable (it was white on white)
    chips = d.execute_script("""return [...document.querySelectorAll('#trial-filters label.chip')].map(c => {
        const s = getComputedStyle(c); return [c.textContent.trim(), s.color, s.backgroundColor]; });""")
    assert chips and all(color == "rgb(255, 255, 255)" and background not in (color, "rgb(250, 251, 252)")
                         for _, color, background in chips), chips
    d.find_element("css selector", f'#trial-filters input[value="{status}"]').click()
    _wait(lambda: table.get_attribute("data-loaded") == "2", 30, "the filtered page")
    rows = d.find_elements("css selector", "#trials tbody tr")
    assert [r.get_attribute("data-status") for r in rows] == [status] * failing.count(status)
    assert d.find_element("id", "trials-count").text == f"{failing.count(status)} trial(s)"


def _submit(s: Served, trials: int, device: str = "cpu") -> int:
    body = {"template": NAME, "shapes": [{"n": 512}], "device": {"kind": device}, "trials": trials,
            "sampler": "random", "seed": 2, "samples": 3, "comparators": False, "finalists": 1}
    r = httpx.post(f"{s.base}/v1/jobs", json=body, headers=auth(s.token), timeout=30)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_the_overview_jobs_table_keeps_every_active_job_when_it_updates(served: Served) -> None:
    """The overview's jobs table polls what the server rendered (every queued and running job, then the
    latest finished ones): an active job older than a page of finished ones still shows after an update."""
    waiting = _submit(served, 1, device="cuda")  # queued for good here: no GPU worker
    newer = [_submit(served, 1, device="cuda") for _ in range(21)]
    for job_id in newer:
        httpx.post(f"{served.base}/v1/jobs/{job_id}/cancel", headers=auth(served.token), timeout=30)
    try:
        _open(served, "/", "overview-jobs")
        d = served.driver
        rows = lambda: [r.get_attribute("data-job") for r in d.find_elements("css selector", "#jobs tbody tr")]  # noqa: E731
        assert str(waiting) in rows()
        _wait(lambda: d.find_element("id", "jobs-updated").text != "", 30, "the jobs table's first update")
        assert str(waiting) in rows() and rows()[0] != str(newer[-1])  # active jobs first, then finished
        # Why it waits, as the API says it, in its row after the update as when the server rendered it.
        job = httpx.get(f"{served.base}/v1/jobs/{waiting}", timeout=30).json()
        said = job["waiting"]
        assert job["waiting_cause"] == "no_device" and said.startswith("no live worker of device cuda"), job
        row = d.find_element("css selector", f'#jobs tbody tr[data-job="{waiting}"]')
        assert row.find_element("css selector", ".waiting-note").text == said
    finally:
        httpx.post(f"{served.base}/v1/jobs/{waiting}/cancel", headers=auth(served.token), timeout=30)


def test_the_overview_gives_a_several_shape_job_its_shapes_bests_not_their_minimum(served: Served) -> None:
    """A job of two shapes has no one best: the overview says how many shapes have one and their range (with
    each shape's in the title), as the server renders it and as the live table redraws it. The recently active
    studies are redrawn too: the study of a shape first tuned while the page is open appears without a reload."""
    d = served.driver
    _open(served, "/", "overview-before")
    d.execute_script("window.__sameDocument = true;")
    body = {"template": NAME, "shapes": [{"n": 256}, {"n": 768}], "device": {"kind": "cpu"}, "trials": 1,
            "sampler": "random", "seed": 4, "samples": 3, "comparators": False, "finalists": 1}
    r = httpx.post(f"{served.base}/v1/jobs", json=body, headers=auth(served.token), timeout=30)
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    _wait(lambda: httpx.get(f"{served.base}/v1/jobs/{job_id}", timeout=30).json()["state"] in ("done", "failed"),
          300, f"job {job_id} to end")
    tasks = httpx.get(f"{served.base}/v1/jobs/{job_id}", timeout=30).json()["tasks"]
    bests = sorted(t["best_us"] for t in tasks if t["best_us"] is not None)
    assert len(bests) == 2, tasks
    studies = lambda: d.find_element("id", "studies").text  # noqa: E731
    _wait(lambda: "n=768" in studies(), 30, "the new shape's study in the live list")
    assert d.execute_script("return window.__sameDocument === true")  # redrawn in place, not reloaded
    total = httpx.get(f"{served.base}/v1/studies", timeout=30).json()["total"]
    assert f"({total} in the store)" == d.find_element("id", "studies-total").text
    _open(served, "/", "overview-two-shapes")
    cell = lambda: d.find_element("css selector", f'#jobs tbody tr[data-job="{job_id}"] td:nth-child(6)')  # noqa: E731
    rendered = cell().text
    assert rendered.startswith("2 of 2 shapes: ") and rendered.endswith(" µs") and "–" in rendered, rendered
    assert "n=256: " in cell().find_element("css selector", "span").get_attribute("title")
    _wait(lambda: d.find_element("id", "jobs-updated").text != "", 30, "the jobs table's first update")
    assert cell().text == rendered  # the live table says the same


def test_running_job_advances_without_reload_and_cancel_needs_the_token(served: Served) -> None:
    running = _submit(served, 40)  # enough trials to be still running when the page has loaded, under load too
    waiting = _submit(served, 40)  # queued behind the first (the server has one worker), then running
    try:
        _follow_and_cancel(served, running, waiting)
    finally:  # the later tests find the server's worker free (the cancel in the page may not have happened)
        for job_id in (running, waiting):
            httpx.post(f"{served.base}/v1/jobs/{job_id}/cancel", headers=auth(served.token), timeout=30)


def _follow_and_cancel(served: Served, running: int, waiting: int) -> None:
    d = served.driver
    _open(served, f"/ui/jobs/{running}", "job")
    d.execute_script("window.__sameDocument = true;")
    label = lambda: d.execute_script("return document.querySelector('#job-progress .label').textContent")  # noqa: E731
    first = label()
    _wait(lambda: label() != first, 240, f"job {running}'s progress to move from {first}")
    assert d.execute_script("return window.__sameDocument === true")  # updated in place, not reloaded
    max_attempts = httpx.get(f"{served.base}/v1/jobs/{running}").json()["max_attempts"]
    assert d.find_element("css selector", "#tasks .t-attempts").text == f"0 / {max_attempts}"  # as the API's
    assert not d.find_element("id", "job-waiting").is_displayed()  # a worker is on it
    browser.screenshot(d, ARTIFACTS / "job-running.png")
    d.set_window_size(1440, 1000)

    _open(served, f"/ui/jobs/{waiting}", "job-cancel")
    (worker,) = d.find_elements("css selector", "#job-candidates tbody tr[data-worker]")  # the server's own
    # it could take it: now, or once free of the running job's task (it holds one between its claims)
    assert re.search(r"yes(, once free)? \(1 of 1 open shape(; busy on another job)?\)$", worker.text), worker.text
    d.find_element("css selector", "#cancel-form button[type=submit]").click()
    result = d.find_element("id", "cancel-result")
    _wait(lambda: "refused" in result.text, 30, "the refusal without a token")
    assert "401" in result.text
    assert httpx.get(f"{served.base}/v1/jobs/{waiting}").json()["state"] in ("queued", "running")
    d.find_element("id", "cancel-token").send_keys(served.token)
    d.find_element("css selector", "#cancel-form button[type=submit]").click()
    try:
        _wait(lambda: result.text == "cancelled", 30, "the cancellation")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the page says {result.text!r}; {d.get_log('browser')}") from None
    assert httpx.get(f"{served.base}/v1/jobs/{waiting}").json()["state"] == "cancelled"
    assert "cancelled" in d.find_element("id", "job-state").text
    assert d.execute_script("return sessionStorage.getItem('tuner.submitToken')") == served.token
    assert served.token not in d.execute_script("return document.cookie")  # kept in the tab's session only


def test_a_job_no_worker_can_take_says_why_it_waits(served: Served) -> None:
    """The page shows the API's ``waiting`` near the job's state and keeps it as it polls the job; the live
    worker that advertises the template is listed as unable to take it (its device differs). As it polls, it
    shows a shape's attempts with their reasons as text, and once the job is cancelled (through the API, not
    the page) it drops the banner and the live workers' card and shows the new state."""
    d = served.driver
    stranded = _submit(served, 4, device="cuda")  # the server's one worker is a CPU worker
    try:
        _open(served, f"/ui/jobs/{stranded}", "job-waiting")
        job = httpx.get(f"{served.base}/v1/jobs/{stranded}").json()
        wanted = job["waiting"]
        assert wanted and wanted.startswith("no live worker of device cuda:any"), wanted
        polled = lambda: d.find_element("id", "job-updated").text.endswith(" UTC")  # noqa: E731 - "s ago" until then
        _wait(polled, 30, "the page to poll the job")
        assert d.find_element("id", "job-waiting").is_displayed()
        assert d.find_element("id", "job-waiting-text").text == wanted
        (worker,) = d.find_elements("css selector", "#job-candidates tbody tr[data-worker]")
        assert "no: the job wants cuda:any" in worker.text, worker.text

        with db.Store.open(served.url) as store:  # a worker gave the shape up, for a reason holding markup
            store.fail_attempt(task_id=job["tasks"][0]["id"], worker_id="ghost", reason="<b>x</b> & more")
        cell = d.find_element("css selector", "#tasks .t-attempts")
        _wait(lambda: "ghost: <b>x</b> & more" in cell.text, 30, "the polled attempt")
        assert cell.text.startswith(f"1 / {job['max_attempts']}") and not cell.find_elements("tag name", "b")

        cancelled = httpx.post(f"{served.base}/v1/jobs/{stranded}/cancel", headers=auth(served.token), timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        _wait(lambda: not d.find_element("id", "job-waiting").is_displayed(), 30, "the banner to go")
        assert d.find_element("id", "job-state").text == "cancelled"
        assert not d.find_element("id", "candidates-card").is_displayed()
    finally:
        httpx.post(f"{served.base}/v1/jobs/{stranded}/cancel", headers=auth(served.token), timeout=30)


def test_template_compare_and_docs_pages_stay_local(served: Served) -> None:
    _open(served, f"/ui/templates/{NAME}", "template")
    assert "n=256" in served.driver.find_element("id", "shapes").text
    ids = [st["id"] for st in httpx.get(f"{served.base}/v1/studies").json()["items"]][:2]
    _open(served, "/ui/compare?" + "&".join(f"study={i}" for i in ids), "compare")
    _open(served, "/docs", "docs")
    served.driver.get(served.base + "/redoc")
    time.sleep(3)
    sent, _blocked = browser.requested_urls(served.driver)  # ReDoc's sidebar image from its CDN: refused by CSP
    assert sent and not browser.foreign(sent, served.base)


def test_the_template_pages_form_asks_the_lookup(served: Served) -> None:
    """Typing a shape into the template page's form and pressing Ask shows what ``GET /v1/best`` serves for it
    on the page's device; the page's link to that API call answers the same config."""
    _open(served, f"/ui/templates/{NAME}", "template-ask-form")
    d = served.driver
    field = d.find_element("css selector", '#ask input[name="shape.n"]')
    assert field.get_attribute("value") == "256"  # the first row's shape
    field.clear()
    field.send_keys("128")
    d.find_element("css selector", "#ask button[type=submit]").click()
    answer = _wait(lambda: d.find_elements("id", "ask-answer"), 30, "the lookup's answer")[0]
    browser.screenshot(d, ARTIFACTS / "template-ask.png")
    assert "shape.n=128" in d.current_url
    rows = {r.find_element("tag name", "th").text: r.find_element("tag name", "td").text
            for r in answer.find_elements("css selector", "tr")}
    assert rows["match"] == "nearest distance 1", rows
    api = d.find_element("css selector", '#ask a[href^="/v1/best?"]').get_attribute("href")
    served_config = httpx.get(api, headers=auth(served.token), timeout=30).json()["config"]
    assert rows["full config"] == ", ".join(f"{k}={v}" for k, v in served_config.items()), (rows, served_config)
    assert not [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def test_optuna_dashboard_sees_metric_name_and_readable_attributes(served: Served) -> None:
    import optuna

    study = optuna.load_study(study_name=optuna.get_all_study_names(served.url)[0], storage=served.url)
    assert study.metric_names == ["median time (µs)"]
    assert study.user_attrs["template"] == NAME and "final_round" in study.user_attrs
    assert study.user_attrs["published"]["median_us"] > 0
    told = [t for t in study.trials if "status" in t.user_attrs]
    assert "OK" in {t.user_attrs["status"] for t in told} and {t.user_attrs.get("role") for t in told} == {"trial"}


def test_the_template_pages_dot_plot_stays_readable_for_15_shapes_and_18_lines(served: Served) -> None:
    """The H200 store's chunk cumsum page: 15 shapes, 4 ceiling lines and 14 of mamba_ssm. Drawn by the
    page's Plotly at the page's width, the plot keeps most of the figure's width (it kept a tenth when the
    legend and the long shape labels ran across it) and one label per shape, none over another."""
    from tuner.api.ui.plots import lines_figure

    lines = [f"ceiling-block{b}" for b in (512, 1024, 2048, 4096)] + [
        f"mamba_ssm-{kind}-bh{h}" for kind in ("fp32", "tileops") for h in (1, 2, 4, 8, 16)] + [
        "mamba_ssm-tileops", "mamba_ssm-wrapper", "mamba_ssm-fp32", "mamba_ssm-triton"]
    rows = [{"workload": f"B={b},H={h},Q=256,S={s},dtype={d},has_bias=true,softplus=true",
             "best_us": 2.0 + i, "default_us": 2.4 + i,
             "lines": {name: 1.5 + i + 0.1 * k for k, name in enumerate(lines)}}
            for i, (b, h, s, d) in enumerate((b, h, s, d) for b in (1, 8, 16) for h, s in ((24, 2048), (80, 32768))
                                             for d in ("float16", "bfloat16", "float32"))][:15]
    _open(served, f"/ui/templates/{NAME}", "template-lines")
    d = served.driver
    size = d.execute_async_script("""const [figure, done] = arguments;
        const div = document.createElement('div');
        div.style.width = document.getElementById('plot-lines').clientWidth + 'px';
        document.getElementById('plot-lines').after(div);
        Plotly.newPlot(div, figure.data, figure.layout).then(() => {
          const labels = [...div.querySelectorAll('.ytick text')].map(t => t.getBoundingClientRect())
            .map(r => [r.top, r.bottom]);
          done({plot: div._fullLayout._size.w, width: div._fullLayout.width, labels: labels});
        });""", lines_figure(rows))
    assert size["plot"] >= 0.45 * size["width"], size
    labels = sorted(size["labels"])
    assert len(labels) == len(rows)
    assert all(top >= bottom - 0.5 for (_, bottom), (top, _) in itertools.pairwise(labels)), labels
