#include "node/dashboard.hpp"

namespace archipelago {

const char* dashboard_page() {
  return R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>archipelago</title>
<style>
body{font:14px system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:18px 0 6px}
#banner{padding:6px 10px;border-radius:4px;background:#eee;display:inline-block}
#banner.down{background:#f8d0d0}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.kpi{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}
.kpi b{display:block;font-size:20px}.kpi>span{color:#666;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:10px}
.chart{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.l,th.l{text-align:left}
.live{color:#1a7f37}.dead{color:#c62828}.joining{color:#9a6700}.left{color:#777}
#events{font-family:monospace;font-size:12px;background:#fff;border:1px solid #ddd;padding:6px;max-height:220px;overflow:auto}
</style></head><body>
<h1>archipelago — live mesh</h1>
<div id="banner">connecting to /status …</div>
<div class="kpis" id="kpis"></div>
<div class="charts">
 <div class="chart" id="chart-goodput"></div><div class="chart" id="chart-rounds"></div>
 <div class="chart" id="chart-members"></div><div class="chart" id="chart-quorum"></div>
 <div class="chart" id="eval-chart"></div>
</div>
<h2>Learners</h2><table id="learners"></table>
<h2>Shards</h2><table id="shards"></table>
<h2>Last rounds</h2><table id="rounds"></table>
<h2>Recent events</h2><div id="events"></div>
<p style="color:#666;font-size:12px">Every figure as GET /status reports it (definitions: docs/concepts/accounting.md);
this page polls it every second. <span id="updates" data-count="0">0 updates</span></p>
<script>
"use strict";
const hist = {t: [], goodput: [], uptime: [], rps: [], live: []};
let last = null, updates = 0, t0 = Date.now();
const colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c])); }
function pct(x) { return x == null || isNaN(x) ? "—" : (100 * x).toFixed(1) + " %"; }
function num(x, d) { return x == null || isNaN(x) ? "—" : Number(x).toFixed(d); }
// A line chart as SVG: series [{name, color, points: [[x, y], ...]}].
function chart(title, xlabel, series, ymax) {
  const w = 420, h = 190, l = 46, r = 10, t = 24, b = 30;
  let x0 = Infinity, x1 = -Infinity, y1 = ymax || 0;
  for (const s of series) for (const [x, y] of s.points) {
    x0 = Math.min(x0, x); x1 = Math.max(x1, x); if (!ymax && isFinite(y)) y1 = Math.max(y1, y);
  }
  if (!isFinite(x0)) { x0 = 0; x1 = 1; }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= 0) y1 = 1;
  const X = x => l + (x - x0) / (x1 - x0) * (w - l - r), Y = y => t + (1 - y / y1) * (h - t - b);
  let svg = `<svg width="${w}" height="${h}" xmlns="http://www.w3.org/2000/svg">` +
    `<text x="${l}" y="15" font-size="12" font-weight="bold">${esc(title)}</text>` +
    `<rect x="${l}" y="${t}" width="${w - l - r}" height="${h - t - b}" fill="none" stroke="#bbb"/>`;
  for (let i = 0; i <= 4; i++) {
    const yv = y1 * i / 4;
    svg += `<text x="${l - 4}" y="${Y(yv) + 4}" font-size="10" text-anchor="end">${+yv.toPrecision(3)}</text>`;
  }
  svg += `<text x="${l}" y="${h - 8}" font-size="10">${+x0.toPrecision(3)}</text>` +
    `<text x="${w - r}" y="${h - 8}" font-size="10" text-anchor="end">${+x1.toPrecision(3)} ${esc(xlabel)}</text>`;
  let lx = w - r;
  for (const s of series.slice().reverse()) {
    const d = s.points.filter(p => isFinite(p[1])).map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ");
    if (d) svg += `<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6"/>`;
    lx -= 8 + 6.5 * s.name.length;
    svg += `<text x="${lx}" y="15" font-size="11" fill="${s.color}">${esc(s.name)}</text>`;
  }
  return svg + "</svg>";
}
function kpi(label, value) { return `<div class="kpi"><b>${value}</b><span>${esc(label)}</span></div>`; }
function table(el, head, rows) {
  document.getElementById(el).innerHTML = "<tr>" + head.map(h => `<th class="${h[1] || ""}">${esc(h[0])}</th>`).join("") + "</tr>" +
    rows.map(r => "<tr>" + r.map(c => `<td class="${c[1] || ""}">${c[0]}</td>`).join("") + "</tr>").join("");
}
function draw(s) {
  const now = (Date.now() - t0) / 1000;
  const live = s.learners.filter(x => x.state === "live").length;
  let rps = NaN;
  if (last && now > last.t) rps = (s.rounds_closed - last.rounds) / (now - last.t);
  last = {t: now, rounds: s.rounds_closed};
  hist.t.push(now); hist.goodput.push(s.goodput); hist.uptime.push(s.uptime); hist.rps.push(rps); hist.live.push(live);
  for (const k in hist) if (hist[k].length > 600) hist[k].shift();
  const rounds = s.recent_rounds || [];
  const lastRound = rounds.length ? rounds[rounds.length - 1] : null;
  document.getElementById("kpis").innerHTML =
    kpi("mode", esc(s.mode)) + kpi("leading broker (epoch)", `${s.broker} (${s.epoch})`) +
    kpi("goodput", pct(s.goodput)) + kpi("uptime", pct(s.uptime)) + kpi("fragment availability", pct(s.fragment_availability)) +
    kpi("rounds closed", `<span id="rounds-closed">${s.rounds_closed}</span>`) + kpi("rounds / s", num(rps, 2)) +
    kpi("live learners / configured", `${live} / ${s.learners_configured}`) +
    kpi("members, last round (K " + s.quorum + ")", lastRound ? lastRound.members : "—") +
    kpi("participation (merged / live)", pct(s.participation)) +
    kpi("grace, last round", num(s.grace_ms, 0) + " ms") +
    kpi("late · rejected · stale", `${s.late} · ${s.rejected} · ${s.stale}`) +
    kpi("ledger", s.ledger_balanced ? "balanced" : "NOT balanced");
  const pts = k => hist.t.map((t, i) => [t, hist[k][i]]);
  document.getElementById("chart-goodput").innerHTML =
    chart("goodput and uptime", "s", [{name: "goodput", color: colors[2], points: pts("goodput")},
                                      {name: "uptime", color: colors[0], points: pts("uptime")}], 1);
  document.getElementById("chart-rounds").innerHTML =
    chart("rounds closed per second", "s", [{name: "rounds/s", color: colors[0], points: pts("rps")}]);
  document.getElementById("chart-members").innerHTML =
    chart("members per round", "round", [
      {name: "members", color: colors[0], points: rounds.map(r => [r.round, r.members])},
      {name: "live at close", color: colors[1], points: rounds.map(r => [r.round, r.live])}],
      Math.max(1, s.learners_configured));
  document.getElementById("chart-quorum").innerHTML =
    chart("per round, ms", "round", [
      {name: "to quorum", color: colors[0], points: rounds.filter(r => r.quorum_ms >= 0).map(r => [r.round, r.quorum_ms])},
      {name: "grace", color: colors[3], points: rounds.map(r => [r.round, r.grace_ms])}]);
  table("learners", [["learner", "l"], ["incarnation"], ["state", "l"], ["steps"], ["step ms"], ["merged tokens"], ["last heard s"]],
    s.learners.map(x => [[x.learner, "l"], [x.incarnation], [x.state, x.state], [x.steps], [num(x.step_ms, 1)],
                         [x.merged_tokens == null ? "—" : x.merged_tokens], [num(x.last_seen_s, 1)]]));
  table("shards", [["shard", "l"], ["incarnation"], ["state", "l"], ["last heard s"], ["endpoint", "l"]],
    s.shards.map(x => { const st = x.last_seen_s < 0 ? "joining" : x.last_seen_s < 3 ? "live" : "dead";
                        return [[x.shard, "l"], [x.incarnation], [st, st], [num(x.last_seen_s, 1)], [esc(x.endpoint), "l"]]; }));
  table("rounds", [["round", "l"], ["fragment"], ["members"], ["to quorum ms"], ["grace ms"], ["closed", "l"], ["s ago"]],
    rounds.slice(-10).reverse().map(r => [[r.round, "l"], [r.fragment], [r.members], [num(r.quorum_ms, 0)], [num(r.grace_ms, 0)],
                                          [esc(r.reason), "l"], [num(r.closed_s, 1)]]));
  document.getElementById("events").innerHTML = (s.events || []).slice().reverse()
    .map(e => `${num(e.ago_s, 1).padStart(7)} s ago  ${esc(e.text)}`).join("<br>") || "(none yet)";
  const u = document.getElementById("updates");
  u.dataset.count = ++updates;
  u.textContent = updates + " updates";
}
async function poll() {
  const banner = document.getElementById("banner");
  try {
    const r = await fetch("/status", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    draw(s);
    banner.className = ""; banner.textContent = "live · " + new Date().toLocaleTimeString();
  } catch (e) {
    banner.className = "down"; banner.textContent = "broker unreachable: " + e.message + " (retrying)";
  }
  setTimeout(poll, 1000);
}
async function pollEvals() {
  try {
    const r = await fetch("/evals", {cache: "no-store"});
    if (r.ok) {
      const pts = await r.json();
      document.getElementById("eval-chart").innerHTML =
        chart("eval loss against tokens (nats/byte)", "tokens", [{name: "global model", color: colors[1], points: pts}]);
    } else {
      document.getElementById("eval-chart").innerHTML = "<p style='width:400px;color:#666'>This process does not evaluate the model (a node's broker): see the learners' or replay's eval.</p>";
    }
  } catch (e) {}
  setTimeout(pollEvals, 5000);
}
poll(); pollEvals();
</script></body></html>
)html";
}

}  // namespace archipelago
