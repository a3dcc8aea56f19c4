// What the pages show, polled from the API: the cluster view (GET /cluster) and every topic's
// summary (GET /topics?stats=1, a page of up to 1000 at a time). Rates are computed here, from
// the counters' deltas between two polls: the server keeps no per-message statistics for us.

import { api } from "./api.js";

export const RATES = [
  ["publish", "Publish", (r) => r.counters.published ?? 0],
  ["deliver", "Deliver", (r) => r.group_counters.delivered ?? 0],
  ["ack", "Ack", (r) => r.group_counters.acked ?? 0],
  ["redeliver", "Redeliver", (r) => r.group_counters.redelivered ?? 0],
  ["dead", "Dead-letter", (r) => r.group_counters.dead_lettered ?? 0],
];
const KEEP = 60; // samples of history for the charts

export const state = {
  cluster: null, // the last GET /cluster
  topics: [], // summaries, each with .rates (per second; null until the second sample)
  totals: null,
  history: [], // [{t, rates}] of the cluster-wide rates, oldest first
  sampledAt: 0,
};
let previous = new Map(); // topic -> {t, counts}
let previousTotals = null; // {t, counts}

function counts(row) {
  return Object.fromEntries(RATES.map(([k, , get]) => [k, get(row)]));
}

function ratesBetween(prev, now, t) {
  const dt = t - prev.t;
  if (!(dt > 0)) return null;
  // (a counter only grows; a topic deleted and made again restarts: never a negative rate)
  return Object.fromEntries(Object.keys(now).map((k) => [k, Math.max(0, now[k] - prev.counts[k]) / dt]));
}

export async function loadCluster() {
  state.cluster = await api("GET", "/cluster");
  return state.cluster;
}

export async function loadTopics() {
  const rows = [];
  let after = null;
  do {
    const q = new URLSearchParams({ stats: "1", limit: "1000" });
    if (after) q.set("after", after);
    const page = await api("GET", `/topics?${q}`);
    rows.push(...page.stats);
    after = page.next;
  } while (after);
  const t = performance.now() / 1000;
  const next = new Map();
  const total = Object.fromEntries(RATES.map(([k]) => [k, 0]));
  const totals = { topics: rows.length, groups: 0, messages: 0, bytes: 0, pending: 0, in_flight: 0, delayed: 0, consumers: 0 };
  for (const row of rows) {
    const c = counts(row);
    const prev = previous.get(row.topic);
    row.rates = prev ? ratesBetween(prev, c, t) : null;
    next.set(row.topic, { t, counts: c });
    for (const k of Object.keys(total)) total[k] += c[k];
    for (const k of ["groups", "messages", "bytes", "pending", "in_flight", "delayed", "consumers"]) totals[k] += row[k];
  }
  previous = next;
  const rates = previousTotals ? ratesBetween(previousTotals, total, t) : null;
  previousTotals = { t, counts: total };
  state.topics = rows;
  state.totals = totals;
  if (rates) state.history.push({ t, rates });
  if (state.history.length > KEEP) state.history.splice(0, state.history.length - KEEP);
  state.sampledAt = Date.now();
  return rows;
}

export function forget() { // (sign-out: another token may see other topics)
  previous = new Map();
  previousTotals = null;
  Object.assign(state, { cluster: null, topics: [], totals: null, history: [], sampledAt: 0 });
}
