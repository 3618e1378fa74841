/* tuner exploration pages: plots, the paged trials table, live job progress, cancel, copy buttons.
   Talks only to this server's /v1 API; loads nothing from elsewhere. */
"use strict";
(function () {
  const ACTIVE = ["queued", "running", "finalizing"];
  const esc = (v) => String(v === null || v === undefined ? "" : v)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  // as the server's `us` filter: 2 decimals below 100 µs, else 1 and thousands separated (20,265.5)
  const clip = (text, n) => text.length > n ? text.slice(0, n - 1) + "…" : text;  // the whole text is the cell's title
  const us = (v) => (v === null || v === undefined) ? "–"
    : (v < 100 ? v.toFixed(2) : v.toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}));
  const cfg = (c) => c ? '<code class="cfg">' + Object.entries(c).map(([k, v]) => esc(k) + "=" + esc(v)).join(", ") + "</code>" : '<span class="muted">–</span>';
  const badge = (s) => '<span class="status st-' + esc(s.toLowerCase()) + '">' + esc(s) + "</span>";
  const stateBadge = (s) => '<span class="state js-' + esc(s) + '">' + esc(s) + "</span>";
  const progress = (done, total, failed) => '<div class="progress" title="' + done + " of " + total + ' trials' +
    (failed ? ", " + failed + " failed" : "") + '"><div class="bar" style="width:' + (total ? 100 * done / total : 0) +
    '%"></div><span class="label">' + done + " / " + total + "</span></div>";
  const attempts = (t, max) => '<span class="' + (t.attempts ? "bad" : "muted") + '" title="distinct workers that gave this shape up, of the ' +
    max + ' that may before it fails">' + t.attempts + " / " + max + "</span>" + (t.attempt_reasons.length ? '<ul class="plain attempts">' +
    t.attempt_reasons.map((a) => "<li><code>" + esc(a.worker_id) + "</code>: " + esc(a.reason) + ' <span class="muted">at ' +
    esc(a.at.slice(0, 19).replace("T", " ")) + " UTC</span></li>").join("") + "</ul>" : "");
  // as the `found` macro: what a verify task's verification found (null: nothing recorded yet)
  const found = (v) => v ? '<span class="' + (v.verdict === "right" ? "good" : "bad") + '" data-verdict="' + esc(v.verdict) +
    '" title="verification ' + v.id + " of " + esc(v.verified_at.slice(0, 19)) + " UTC, study " + v.study_id + '">' +
    esc(v.summary) + "</span>" : "";
  const getJSON = async (url, options) => {
    const response = await fetch(url, Object.assign({credentials: "same-origin", headers: {Accept: "application/json"}}, options || {}));
    const body = await response.json().catch(() => ({}));
    return {ok: response.ok, status: response.status, body};
  };
  const detail = (body) => Array.isArray(body.detail) ? body.detail.map((d) => d.msg).join("; ") : (body.detail || "");

  // -- plots -------------------------------------------------------------------------------------------
  function drawPlots() {
    if (!window.Plotly) return;
    document.querySelectorAll("[data-figure]").forEach((div) => {
      const source = document.getElementById(div.dataset.figure);
      if (!source) return;
      const fig = JSON.parse(source.textContent);
      window.Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false, showLink: false,
        showSendToCloud: false, showEditInChartStudio: false, displayModeBar: div.classList.contains("small") ? false : "hover",
        modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"]});
    });
  }

  // -- trials table (server-paged) ---------------------------------------------------------------------
  function trialsTable() {
    const table = document.getElementById("trials");
    if (!table) return;
    const size = Number(table.dataset.pageSize || 25);
    const state = {sort: "trial_number", offset: 0, total: 0};
    const body = table.querySelector("tbody");
    const statuses = () => Array.from(document.querySelectorAll('#trial-filters input[name=status]:checked')).map((i) => i.value);
    async function load() {
      const params = new URLSearchParams({sort: state.sort, limit: size, offset: state.offset});
      statuses().forEach((s) => params.append("status", s));
      const answer = await getJSON(table.dataset.src + "?" + params);
      if (!answer.ok) { body.innerHTML = '<tr class="empty"><td colspan="7">' + esc(detail(answer.body)) + "</td></tr>"; return; }
      const page = answer.body;
      state.total = page.total;
      body.innerHTML = page.items.length ? page.items.map((m) => "<tr data-status=\"" + esc(m.status) + "\">" +
        "<td>" + esc(m.trial_number === null ? "" : m.trial_number) + "</td><td>" + cfg(m.config) + "</td><td>" + badge(m.status) +
        '</td><td class="num">' + us(m.median_us) + '</td><td class="num">' +
        (m.p20_us === null ? "" : us(m.p20_us) + "–" + us(m.p80_us)) + '</td><td class="reason" title="' + esc(m.reason || "") + '">' +
        esc(clip((m.reason || "").split("\n")[0], 140)) + "</td><td>" + esc(m.created_at.slice(0, 19).replace("T", " ")) +
        "</td></tr>").join("") : '<tr class="empty"><td colspan="7">no trial matches</td></tr>';
      const pages = Math.max(1, Math.ceil(page.total / size));
      document.getElementById("trials-page").textContent = "page " + (state.offset / size + 1) + " of " + pages;
      document.getElementById("trials-count").textContent = page.total + " trial(s)";
      document.getElementById("trials-prev").disabled = state.offset === 0;
      document.getElementById("trials-next").disabled = state.offset + size >= page.total;
      table.querySelectorAll("th[data-sort]").forEach((th) => {
        th.classList.toggle("sorted-asc", state.sort === th.dataset.sort);
        th.classList.toggle("sorted-desc", state.sort === "-" + th.dataset.sort);
      });
      table.dataset.loaded = String(Number(table.dataset.loaded || 0) + 1);
    }
    document.querySelectorAll('#trial-filters input[name=status]').forEach((i) => i.addEventListener("change", () => { state.offset = 0; load(); }));
    table.querySelectorAll("th[data-sort]").forEach((th) => th.addEventListener("click", () => {
      state.sort = state.sort === th.dataset.sort ? "-" + th.dataset.sort : th.dataset.sort;
      state.offset = 0; load();
    }));
    document.getElementById("trials-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - size); load(); });
    document.getElementById("trials-next").addEventListener("click", () => { state.offset += size; load(); });
    load();
  }

  // -- parameter importance (computed by the server on request) ------------------------------------------
  async function importance() {
    const box = document.getElementById("importance");
    if (!box) return;
    const answer = await getJSON(box.dataset.src);
    if (!answer.ok) { box.innerHTML = '<p class="muted">' + esc(detail(answer.body)) + "</p>"; return; }
    const imp = answer.body;
    if (!imp.importances || !Object.keys(imp.importances).length) { box.innerHTML = '<p class="muted">' + esc(imp.note || "not available") + "</p>"; return; }
    const max = Math.max(...Object.values(imp.importances), 1e-9);
    box.innerHTML = Object.entries(imp.importances).map(([name, v]) => '<div class="importance-row"><code>' + esc(name) +
      '</code><div class="bar" style="width:' + (100 * v / max) + '%"></div><span class="num">' + v.toFixed(3) + "</span></div>").join("") +
      '<p class="muted small">' + esc(imp.note || "") + "</p>";
  }

  // -- copy buttons ------------------------------------------------------------------------------------
  function copyButtons() {
    document.querySelectorAll("button[data-copy]").forEach((b) => b.addEventListener("click", async () => {
      const text = document.getElementById(b.dataset.copy).textContent;
      try { await navigator.clipboard.writeText(text); b.textContent = "Copied"; }
      catch (e) { const r = document.createRange(); r.selectNodeContents(document.getElementById(b.dataset.copy));
        const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(r); b.textContent = "Selected: press Ctrl+C"; }
      setTimeout(() => { b.textContent = b.textContent === "Copied" ? "Copied ✓" : b.textContent; }, 10);
    }));
  }

  // -- job page: live progress, why it waits, who gave its shapes up, and cancel ---------------------------------
  function renderJob(job) {
    const root = document.getElementById("job");
    // A job never leaves a finished state: an active one is a stale answer (a poll sent before the cancel).
    if (!ACTIVE.includes(root.dataset.state) && ACTIVE.includes(job.state)) return;
    root.dataset.state = job.state;
    document.getElementById("job-state").innerHTML = stateBadge(job.state);
    const shapesDone = job.tasks.filter((t) => t.state === "done").length; // a verify job has no trials
    document.getElementById("job-progress").innerHTML = job.kind === "verify"
      ? progress(shapesDone, job.tasks.length) : progress(job.progress.trials_done, job.progress.trials_total);
    document.getElementById("job-updated").textContent = job.updated_at.slice(11, 19) + " UTC";
    const waiting = document.getElementById("job-waiting");
    waiting.hidden = !job.waiting; document.getElementById("job-waiting-text").textContent = job.waiting || "";
    const error = document.getElementById("job-error");
    error.hidden = !job.error; error.textContent = job.error || "";
    job.tasks.forEach((t) => {
      const row = document.querySelector('tr[data-task="' + t.id + '"]');
      if (!row) return;
      if (t.study_id && !row.querySelector("a")) row.cells[0].innerHTML = '<a href="/ui/studies/' + t.study_id + '">' + esc(t.label) + "</a>";
      row.querySelector(".t-state").innerHTML = stateBadge(t.state);
      row.querySelector(".t-progress").innerHTML = progress(t.trials_done, t.trials_total, t.trials_failed);
      row.querySelector(".t-failed").textContent = t.trials_failed;
      row.querySelector(".t-best").textContent = us(t.best_us);
      row.querySelector(".t-config").innerHTML = cfg(t.best_config || (t.verification && t.verification.config));
      const verified = row.querySelector(".t-found");  // a verify job's rows only
      if (verified) verified.innerHTML = found(t.verification);
      row.querySelector(".t-attempts").innerHTML = attempts(t, job.max_attempts);
      row.querySelector(".t-error").textContent = t.error || "";
    });
    document.getElementById("job-workers").innerHTML = job.workers.length ?
      job.workers.map((w) => "<li><code>" + esc(w) + "</code></li>").join("") : '<li class="muted">none now</li>';
    document.getElementById("cancel-form").hidden = !ACTIVE.includes(job.state);  // the card keeps its last message
    document.getElementById("candidates-card").hidden = !["queued", "running"].includes(job.state);  // finished: none claims it
  }

  function jobPage() {
    const root = document.getElementById("job");
    if (!root) return;
    const id = root.dataset.job;
    const tick = async () => {
      const answer = await getJSON("/v1/jobs/" + id).catch(() => null);
      if (answer && answer.ok) renderJob(answer.body);
      if (ACTIVE.includes(root.dataset.state)) setTimeout(tick, 1000);
    };
    if (ACTIVE.includes(root.dataset.state)) setTimeout(tick, 1000);
    const input = document.getElementById("cancel-token");
    input.value = sessionStorage.getItem("tuner.submitToken") || "";
    document.getElementById("forget-token").addEventListener("click", () => { sessionStorage.removeItem("tuner.submitToken"); input.value = ""; });
    document.getElementById("cancel-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const out = document.getElementById("cancel-result");
      const token = input.value.trim();
      const headers = {Accept: "application/json"};
      if (token) headers.Authorization = "Bearer " + token;
      const answer = await getJSON("/v1/jobs/" + id + "/cancel", {method: "POST", headers});
      if (answer.ok) {
        sessionStorage.setItem("tuner.submitToken", token);
        out.className = "small good"; out.textContent = "cancelled";
        renderJob(answer.body);
      } else {
        if (answer.status === 401 || answer.status === 403) sessionStorage.removeItem("tuner.submitToken");
        out.className = "small bad"; out.textContent = "refused (" + answer.status + "): " + detail(answer.body);
      }
    });
  }

  // -- overview: live jobs table -------------------------------------------------------------------------
  function overviewJobs() {
    const table = document.getElementById("jobs");
    if (!table || !table.dataset.poll) return;
    const body = table.querySelector("tbody");
    // The rows the server rendered: every queued and running job (newest first), then the latest finished
    // ones; the last URL lists the latest jobs of every state.
    const urls = table.dataset.poll.split(" ");
    const tick = async () => {
      const answers = await Promise.all(urls.map((u) => getJSON(u).catch(() => null)));
      if (answers.every((a) => a && a.ok)) {
        const byId = new Map(answers.slice(0, -1).flatMap((a) => a.body.items).map((j) => [j.id, j])); // a job may move between lists
        const active = [...byId.values()].sort((a, b) => b.id - a.id);
        const finished = answers[answers.length - 1].body.items
          .filter((j) => j.state !== "queued" && j.state !== "running" && !byId.has(j.id));
        const items = active.concat(finished);
        if (items.length) body.innerHTML = items.map((j) => {
          // one shape: its best; several: how many have one, and their range (a minimum over shapes is no one's best)
          const done = j.tasks.filter((t) => t.best_us !== null);
          const bests = done.map((t) => t.best_us);
          const best = !done.length ? "–" : j.tasks.length === 1 ? us(bests[0]) + " µs"
            : '<span class="small" title="' + esc(done.map((t) => t.label + ": " + us(t.best_us) + " µs").join("; ")) + '">' +
              done.length + " of " + j.tasks.length + " shapes: " + us(Math.min(...bests)) +
              (done.length > 1 ? "–" + us(Math.max(...bests)) : "") + " µs</span>";
          const work = j.kind === "verify" // no trials: each shape's best re-measured in fresh processes
            ? '<span class="small">verify: ' + j.tasks.filter((t) => t.state === "done").length + " / " + j.tasks.length +
              " shape(s) re-measured in " + j.processes + " processes</span>"
            : progress(j.progress.trials_done, j.progress.trials_total);
          return '<tr data-job="' + j.id + '"><td><a href="/ui/jobs/' + j.id + '">#' + j.id + "</a></td><td>" + stateBadge(j.state) +
            (j.waiting ? '<div class="waiting-note small" title="why it waits">' + esc(j.waiting) + "</div>" : "") +
            "</td><td>" + esc(j.template) + ' <span class="muted">v' + esc(j.template_version) + "</span></td><td>" + esc(j.device.kind) +
            (j.device.name ? " · " + esc(j.device.name) : "") + "</td><td>" + work +
            "</td><td>" + best + "</td><td>" + j.workers.length + "</td></tr>";
        }).join("");
        document.getElementById("jobs-updated").textContent = "updated " + new Date().toLocaleTimeString();
      }
      setTimeout(tick, 2000);
    };
    setTimeout(tick, 2000);
  }

  // -- overview: the recently active studies, redrawn as they are measured -------------------------------
  function ago(iso) {  // as the server's `ago` filter writes it
    const seconds = (Date.now() - Date.parse(iso)) / 1000;
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
      if (seconds >= size) return Math.round(seconds / size) + " " + unit + " ago";
    }
    return Math.round(Math.max(seconds, 0)) + " s ago";
  }

  function overviewStudies() {
    const table = document.getElementById("studies");
    if (!table || !table.dataset.poll) return;
    const body = table.querySelector("tbody");
    const tick = async () => {
      const answer = await getJSON(table.dataset.poll).catch(() => null);
      if (answer && answer.ok && answer.body.items.length) {
        body.innerHTML = answer.body.items.map((s) => '<tr data-study="' + s.id + '"><td><a href="' + esc(s.page) +
          '" title="' + esc(s.name) + '">' + esc(s.workload || s.shape_key) + '</a> <span class="muted">' + esc(s.template) +
          " v" + esc(s.template_version) + "</span></td><td>" + esc(s.device_name) + '</td><td class="num">' + us(s.best_us) +
          (s.best_p20_us !== null ? ' <span class="muted">(' + us(s.best_p20_us) + "–" + us(s.best_p80_us) + ")</span>" : "") +
          '</td><td class="num">' + us(s.fastest_trial_us) + '</td><td class="num">' + s.trials + " (" + s.failed + ")</td><td>" +
          ago(s.last_activity) + "</td></tr>").join("");
        document.getElementById("studies-total").textContent = "(" + answer.body.total + " in the store)";
      }
      setTimeout(tick, 3000);
    };
    setTimeout(tick, 3000);
  }

  function autoSubmit() {
    document.querySelectorAll("select[data-autosubmit]").forEach((s) => s.addEventListener("change", () => s.form.submit()));
  }

  document.addEventListener("DOMContentLoaded", () => {
    autoSubmit();
    drawPlots(); trialsTable(); importance(); copyButtons(); jobPage(); overviewJobs(); overviewStudies();
  });
})();
