// The dashboard: plain JS, no framework, no build. The path picks the view:
//   /dashboard/                                  every topic
//   /dashboard/topics/{tenant}/{namespace}/{t}   one topic
// Data comes from the admin API and two dashboard views (/dashboard/api/...), each call with
// the token kept in sessionStorage (when authentication is on). A 401 asks for a token; a 403
// shows, in the section it hides, why this role may not see it.
"use strict";

const TOKEN_KEY = "compactorToken";
const POLL_MS = 300; // how often a running compaction's progress is asked for
const view = document.getElementById("view");
const notice = document.getElementById("notice");

class HttpError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

async function call(method, path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { method, headers });
  if (!r.ok) {
    let reason = r.statusText;
    try { reason = (await r.json()).reason || reason; } catch (_) { /* not JSON */ }
    if (r.status === 401) showNotice(`Authentication needed: ${reason}. Enter a token above.`);
    throw new HttpError(r.status, reason);
  }
  return r.status === 204 ? null : r.json();
}

function showNotice(text) {
  notice.textContent = text;
  notice.hidden = !text;
}

// ------------------------------------------------------------------ formatting

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (n) => (n == null ? "–" : Number(n).toLocaleString("en"));

function bytes(n) {
  if (n == null || n < 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

const when = (ms) => (ms ? new Date(ms).toLocaleString() : "–");
const pct = (x) => (x == null ? "–" : `${(x * 100).toFixed(1)}%`);
const status = (s) => (s ? `<span class="status-${esc(s)}">${esc(s)}</span>` : "–");

function denied(e) {
  if (e instanceof HttpError && (e.status === 401 || e.status === 403)) {
    return `<p class="denied">Not permitted (${e.status}): ${esc(e.message)}</p>`;
  }
  return `<p class="denied">Could not load: ${esc(e.message)}</p>`;
}

// A section filled by `render(data)` once `load()` answers, or with the reason it could not.
async function section(id, title, load, render) {
  const el = document.getElementById(id);
  el.innerHTML = `<h2>${esc(title)}</h2><p class="muted">Loading…</p>`;
  try {
    el.innerHTML = `<h2>${esc(title)}</h2>${render(await load())}`;
  } catch (e) {
    el.innerHTML = `<h2>${esc(title)}</h2>${denied(e)}`;
  }
}

// ------------------------------------------------------------------ the topic list

async function topicsView() {
  document.title = "Topics · Topic compactor";
  view.innerHTML = `<h1>Topics</h1><section id="topics"></section>`;
  await section("topics", "Every topic", () => call("GET", "/dashboard/api/topics"), (topics) => {
    if (!topics.length) return `<p class="muted">No topics yet.</p>`;
    const rows = topics.map((t) => {
      const path = t.name.replace("persistent://", "");
      return `<tr>
        <td><a href="/dashboard/topics/${path.split("/").map(encodeURIComponent).join("/")}">${esc(t.name)}</a></td>
        <td class="num">${bytes(t.storage_size)}</td>
        <td class="num">${num(t.backlog)}</td>
        <td class="num">${t.compacted_entries ? bytes(t.compacted_size) : "–"}</td>
        <td class="num">${pct(t.saved_share)}</td>
        <td>${when(t.last_finished_at || t.last_started_at)}</td>
        <td>${esc(t.last_trigger || "–")}</td>
        <td>${status(t.last_status)}</td></tr>`;
    });
    return `<table><thead><tr><th>Topic</th><th class="num">Storage</th><th class="num">Backlog</th>
      <th class="num">Compacted</th><th class="num">Saved</th><th>Last compaction</th><th>Trigger</th>
      <th>Outcome</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  });
}

// ------------------------------------------------------------------ one topic

function runsChart(runs) {
  const done = runs.filter((r) => r.status === "SUCCESS" && r.bytesIn != null).reverse().slice(-30);
  if (!done.length) return `<p class="muted">No compaction has written a ledger yet.</p>`;
  const W = 720, H = 220, left = 56, right = 56, top = 12, bottom = 30;
  const plotW = W - left - right, plotH = H - top - bottom;
  const maxBytes = Math.max(1, ...done.map((r) => Math.max(r.bytesIn, r.bytesOut || 0)));
  const maxMs = Math.max(1, ...done.map((r) => r.durationMs || 0));
  const slot = plotW / done.length, bar = Math.max(2, Math.min(18, slot / 2 - 2));
  const y = (b) => top + plotH - (b / maxBytes) * plotH;
  const yMs = (ms) => top + plotH - (ms / maxMs) * plotH;
  let svg = `<svg class="chart" viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="Compaction runs">`;
  svg += `<line x1="${left}" y1="${top + plotH}" x2="${W - right}" y2="${top + plotH}" stroke="#cbd5e1"/>`;
  svg += `<text x="${left - 4}" y="${top + 8}" text-anchor="end">${esc(bytes(maxBytes))}</text>`;
  svg += `<text x="${left - 4}" y="${top + plotH}" text-anchor="end">0</text>`;
  svg += `<text x="${W - right + 4}" y="${top + 8}">${(maxMs / 1000).toFixed(1)} s</text>`;
  const points = [];
  done.forEach((r, i) => {
    const x = left + i * slot + slot / 2;
    svg += `<rect x="${x - bar - 1}" y="${y(r.bytesIn)}" width="${bar}" height="${top + plotH - y(r.bytesIn)}" fill="#94a3b8"><title>run ${r.id}: ${esc(bytes(r.bytesIn))} before</title></rect>`;
    svg += `<rect x="${x + 1}" y="${y(r.bytesOut || 0)}" width="${bar}" height="${top + plotH - y(r.bytesOut || 0)}" fill="#2563eb"><title>run ${r.id}: ${esc(bytes(r.bytesOut))} after</title></rect>`;
    if (done.length <= 15 || i % Math.ceil(done.length / 15) === 0) {
      svg += `<text x="${x}" y="${H - 14}" text-anchor="middle">#${r.id}</text>`;
    }
    points.push([x, yMs(r.durationMs || 0), r]);
  });
  svg += `<polyline fill="none" stroke="#f59e0b" stroke-width="1.5" points="${points.map(([x, yy]) => `${x},${yy}`).join(" ")}"/>`;
  for (const [x, yy, r] of points) {
    svg += `<circle cx="${x}" cy="${yy}" r="3" fill="#f59e0b"><title>run ${r.id}: ${r.durationMs} ms</title></circle>`;
  }
  svg += `</svg>`;
  return `${svg}<div class="legend"><i style="background:#94a3b8"></i>size before (bytes read)
    <i style="background:#2563eb"></i>size after (compacted ledger)
    <i style="background:#f59e0b"></i>duration (right axis)</div>`;
}

function runsTable(runs) {
  const rows = runs.slice(0, 10).map((r) => `<tr><td>#${r.id}</td><td>${when(r.startedAt)}</td>
    <td>${esc(r.trigger)}</td><td>${status(r.status)}</td><td class="num">${num(r.entriesRead)}</td>
    <td class="num">${num(r.recordsRemoved)}</td><td class="num">${bytes(r.bytesIn)}</td>
    <td class="num">${bytes(r.bytesOut)}</td><td class="num">${num(r.phaseOneMs)}</td>
    <td class="num">${num(r.phaseTwoMs)}</td><td class="num">${num(r.durationMs)}</td>
    <td class="num">${r.readThroughput == null ? "–" : bytes(r.readThroughput) + "/s"}</td></tr>`);
  return `<table><thead><tr><th>Run</th><th>Started</th><th>Trigger</th><th>Outcome</th>
    <th class="num">Read</th><th class="num">Removed</th><th class="num">Before</th><th class="num">After</th>
    <th class="num">Phase 1 ms</th><th class="num">Phase 2 ms</th><th class="num">Total ms</th>
    <th class="num">Throughput</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

async function topicView(tenant, namespace, topic) {
  const name = `persistent://${tenant}/${namespace}/${topic}`;
  const admin = `/admin/v2/persistent/${[tenant, namespace, topic].map(encodeURIComponent).join("/")}`;
  document.title = `${topic} · Topic compactor`;
  view.innerHTML = `<p><a href="/dashboard/">← Topics</a></p><h1>${esc(name)}</h1>
    <section id="compaction"></section>
    <section id="history"></section>
    <section id="ledgers"></section>
    <section id="cursors"></section>
    <section id="policies"></section>`;

  const compactionSection = document.getElementById("compaction");
  compactionSection.innerHTML = `<h2>Compaction</h2>
    <div class="compact">
      <button id="compact-now" type="button">Compact now</button>
      <div>Status: <span id="compaction-status" class="muted">…</span></div>
      <div id="progress" hidden>
        <div class="bar"><div id="progress-bar"></div></div>
        <div id="progress-text" class="muted"></div>
      </div>
    </div>
    <p id="table" hidden></p>
    <p id="compaction-error" class="denied" hidden></p>`;
  const button = document.getElementById("compact-now");
  const statusEl = document.getElementById("compaction-status");
  const progressEl = document.getElementById("progress");
  const errorEl = document.getElementById("compaction-error");
  let polling = false;

  const showError = (text) => { errorEl.textContent = text || ""; errorEl.hidden = !text; };

  function showStatus(st) {
    statusEl.innerHTML = status(st.status);
    button.disabled = st.status === "RUNNING";
    const p = st.progress;
    progressEl.hidden = !p;
    if (p) {
      document.getElementById("progress-bar").style.width = `${p.percent}%`;
      document.getElementById("progress-text").textContent =
        `${p.phase} · ${p.percent.toFixed(1)}% · ${num(p.entriesRead)} / ${num(p.entriesTotal)} entries · ` +
        `${bytes(p.bytesRead)} / ${bytes(p.bytesTotal)} · ${(p.elapsedMs / 1000).toFixed(1)} s`;
    }
    if (st.status === "ERROR") showError(st.lastError || "the compaction failed");
    showTable(st.table);
  }

  // The topic's Iceberg table (docs/tables.md): its snapshot and how many rounds it lags.
  function showTable(t) {
    const el = document.getElementById("table");
    el.hidden = !t;
    if (!t) return;
    const lag = `lag ${num(t.lagRounds)} round${t.lagRounds === 1 ? "" : "s"}`;
    el.className = t.lagRounds ? "denied" : "muted";
    el.textContent = `Iceberg table: ${t.enabled ? "on" : "off (dropped at the next round)"} · ` +
      // Not the snapshot's id: a 64-bit id loses digits as a JavaScript number.
      `${t.snapshotId == null ? "no snapshot yet" : "snapshot committed"} · ${lag}` +
      (t.lastError ? ` · last commit failed: ${t.lastError}` : "");
  }

  async function poll() {
    if (polling) return;
    polling = true;
    try {
      for (;;) {
        const st = await call("GET", `${admin}/compaction`);
        showStatus(st);
        if (st.status !== "RUNNING") break;
        await new Promise((done) => setTimeout(done, POLL_MS));
      }
      await refresh();
    } catch (e) {
      statusEl.innerHTML = denied(e);
    } finally {
      polling = false;
    }
  }

  button.addEventListener("click", async () => {
    showError("");
    button.disabled = true;
    try {
      await call("PUT", `${admin}/compaction`);
      showStatus({ status: "RUNNING", progress: null });
      await poll();
    } catch (e) {
      button.disabled = false;
      // 409: one is running already (follow it); 401/403: this role may not compact.
      if (e instanceof HttpError && e.status === 409) { await poll(); return; }
      showError(e instanceof HttpError && (e.status === 401 || e.status === 403)
        ? `Not permitted (${e.status}): ${e.message}` : e.message);
    }
  });

  async function refresh() {
    await Promise.all([
      section("history", "Run history", () => call("GET", `${admin}/compactionRuns?limit=50`),
        (runs) => runs.length ? runsChart(runs) + runsTable(runs) : `<p class="muted">Never compacted.</p>`),
      section("ledgers", "Ledgers", () => call("GET", `${admin}/internalStats`), (st) => {
        const c = st.compactedLedger;
        const ledgers = st.ledgers.map((l) => `<tr><td>${l.ledgerId}</td><td>${esc(l.state)}</td>
          <td class="num">${num(l.entries)}</td><td class="num">${bytes(l.size)}</td>
          <td class="num">${bytes(l.fileSize)}</td></tr>`);
        return `<div class="grid">
            <div class="kv"><b>${num(st.numberOfEntries)}</b><span>entries in the log</span></div>
            <div class="kv"><b>${bytes(st.totalSize)}</b><span>log size</span></div>
            <div class="kv"><b>${c.ledgerId === -1 ? "none" : c.ledgerId}</b><span>compacted ledger</span></div>
            <div class="kv"><b>${c.ledgerId === -1 ? "–" : num(c.entries)}</b><span>compacted entries</span></div>
            <div class="kv"><b>${c.ledgerId === -1 ? "–" : bytes(c.size)}</b><span>compacted size</span></div>
            <div class="kv"><b>${esc(st.horizon || "–")}</b><span>horizon</span></div>
          </div>
          <table><thead><tr><th>Ledger</th><th>State</th><th class="num">Entries</th><th class="num">Size</th>
          <th class="num">File</th></tr></thead><tbody>${ledgers.join("")}</tbody></table>`;
      }),
      section("cursors", "Cursors and backlogs", () => call("GET", `${admin}/stats`), (st) => {
        const subs = Object.entries(st.subscriptions);
        if (!subs.length) return `<p class="muted">No subscriptions.</p>`;
        const rows = subs.map(([n, s]) => `<tr><td>${esc(n)}</td><td>${esc(s.markDeletePosition || "–")}</td>
          <td class="num">${num(s.msgBacklog)}</td><td class="num">${bytes(s.backlogSize)}</td>
          <td class="num">${num(s.unackedMessages)}</td><td class="num">${s.consumers.length}</td></tr>`);
        return `<table><thead><tr><th>Cursor</th><th>Mark-delete</th><th class="num">Backlog</th>
          <th class="num">Backlog size</th><th class="num">Unacked</th><th class="num">Consumers</th></tr></thead>
          <tbody>${rows.join("")}</tbody></table>`;
      }),
      section("policies", "Policies (applied)", () =>
        call("GET", `/dashboard/api/topics/${[tenant, namespace, topic].map(encodeURIComponent).join("/")}/policies`),
        (ps) => {
          const rows = Object.entries(ps).map(([f, p]) => `<tr><td>${esc(f)}</td>
            <td>${p.value == null ? "–" : esc(JSON.stringify(p.value))}</td>
            <td class="src-${esc(p.source)}">${esc(p.source)}</td></tr>`);
          return `<table><thead><tr><th>Policy</th><th>Applied value</th><th>From</th></tr></thead>
            <tbody>${rows.join("")}</tbody></table>`;
        }),
    ]);
  }

  await refresh();
  await poll(); // a round already running (started by the scheduler or another user) shows too
}

// ------------------------------------------------------------------ start

function route() {
  const m = location.pathname.match(/^\/dashboard\/topics\/([^/]+)\/([^/]+)\/([^/]+)\/?$/);
  if (m) return topicView(...m.slice(1).map(decodeURIComponent));
  return topicsView();
}

const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem(TOKEN_KEY) || "";
document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = tokenInput.value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  showNotice("");
  route();
});
document.getElementById("token-clear").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  tokenInput.value = "";
  route();
});

route();
