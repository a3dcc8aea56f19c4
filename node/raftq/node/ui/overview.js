// Overview: each node's health, the totals of the topics this token sees, and rates.

import { RATES, loadCluster, loadTopics, state } from "./data.js";
import { age, bytes, h, num, rate, sparkline } from "./dom.js";

// When a node last wrote a snapshot, by this browser's clock (the node's wall clock sent).
function ago(at) {
  return at ? `${age(Math.max(0, Date.now() - at * 1000))} ago` : "—";
}

function nodeRows(cluster) {
  const members = Object.entries(cluster.members || {}).sort(([a], [b]) => a.localeCompare(b));
  const leader = members.find(([id]) => id === cluster.leader);
  const commit = leader?.[1].figures?.commit_index ?? cluster.commit_index;
  return members.map(([id, m]) => {
    const f = m.figures || {};
    const up = m.answers;
    const lag = up && f.applied_index !== undefined ? Math.max(0, commit - f.applied_index) : null;
    const fsyncMs = f.fsyncs ? (1000 * f.fsync_seconds) / f.fsyncs : null;
    return h("tr", { "data-node": id },
      h("td", {}, h("strong", {}, id), m.self ? h("span", { class: "muted" }, " (this node)") : null),
      h("td", { class: "mono" }, m.api || "—"),
      h("td", {}, h("span", { class: `pill ${up ? "up" : "down"}`, "data-up": up ? "up" : "down" }, up ? "up" : "down")),
      h("td", {}, up ? h("span", { class: f.role === "leader" ? "pill leader" : "" }, f.role ?? "—") : "—"),
      h("td", { class: "num" }, up ? num(f.term) : "—"),
      h("td", { class: "num" }, up ? num(f.commit_index) : "—"),
      h("td", { class: `num ${lag > 100 ? "warn" : ""}` }, up ? num(lag) : "—"),
      h("td", { class: "num" }, up ? bytes(f.rss_bytes) : "—"),
      h("td", { class: "num" }, fsyncMs === null ? "—" : `${fsyncMs.toFixed(2)} ms`, h("span", { class: "muted" }, f.fsyncs ? ` × ${num(f.fsyncs)}` : "")),
      h("td", { class: "num" }, up && f.snapshots !== undefined && f.snapshots !== null
        ? `${num(f.snapshots)}${f.snapshots ? `, last ${ago(f.last_snapshot_at)} (${f.last_snapshot_seconds.toFixed(2)} s)` : ""}` : "—"),
    );
  });
}

const TOPICS_EVERY_MS = 6000;

const CARDS = [
  ["topics", "Topics", num], ["groups", "Groups", num], ["messages", "Messages", num],
  ["bytes", "Retained", bytes], ["pending", "Pending", num], ["in_flight", "In flight", num],
  ["delayed", "Delayed", num], ["consumers", "Consumers", num],
];

export function overview(main) {
  const head = h("p", { class: "muted", id: "cluster-line" });
  const nodes = h("tbody", { id: "nodes" });
  const cards = h("div", { class: "grid cards", id: "totals" });
  const charts = h("div", { class: "grid charts", id: "rates" });
  main.replaceChildren(
    h("h1", {}, "Overview"), head,
    h("h2", {}, "Nodes"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Node", "API", "Status", "Role", "Term", "Commit", "Lag", "RSS", "fsync (avg)", "Snapshots"]
        .map((t, i) => h("th", { class: i >= 4 ? "num" : "", scope: "col" }, t)))),
      nodes)),
    h("h2", {}, "Totals ", h("span", { class: "muted" }, "(the topics this token sees)")),
    cards,
    h("h2", {}, "Rates ", h("span", { class: "muted" }, "(per second, over 6 s, last 6 minutes)")),
    charts,
  );
  function draw() {
    const c = state.cluster;
    if (c) {
      head.textContent = `Connected to ${c.node} (${c.role}), leader ${c.leader ?? "none"}, term ${c.term}.`;
      nodes.replaceChildren(...nodeRows(c));
    }
    const t = state.totals;
    if (t) {
      cards.replaceChildren(...CARDS.map(([k, label, fmt]) =>
        h("div", { class: "panel card", "data-total": k }, h("div", { class: "value" }, fmt(t[k])), h("div", { class: "label" }, label))));
      const last = state.history.at(-1)?.rates;
      charts.replaceChildren(...RATES.map(([k, label]) =>
        h("div", { class: "panel chart card", "data-rate": k },
          h("div", { class: "label" }, label),
          h("div", { class: "value" }, last ? `${rate(last[k])}/s` : "…"),
          sparkline(state.history.map((s) => s.rates[k])))));
    }
  }
  draw();
  return {
    // The nodes every poll (a node down shows within seconds); the topics' figures every
    // TOPICS_EVERY_MS (the costlier read, for each open console, at the leader).
    async refresh() {
      const stale = Date.now() - state.sampledAt >= TOPICS_EVERY_MS - 500;
      await Promise.all([loadCluster(), stale ? loadTopics() : null]);
      draw();
      performance.mark("overview-drawn");
    },
  };
}
