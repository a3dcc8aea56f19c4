// Topics: every topic this token sees, a sortable table; create one (with admin rights).

import { api, may } from "./api.js";
import { loadTopics, state } from "./data.js";
import { age, bytes, h, num, rate, say, sortableTable } from "./dom.js";

const link = (name) => h("a", { href: `#/topic/${encodeURIComponent(name)}` }, name);
const r = (k) => (row) => row.rates?.[k] ?? null;

export function topics(main) {
  const table = sortableTable([
    { key: "topic", label: "Topic", render: (row) => link(row.topic) },
    { key: "messages", label: "Messages", num: true, render: (row) => num(row.messages) },
    { key: "bytes", label: "Bytes", num: true, render: (row) => bytes(row.bytes) },
    { key: "publish", label: "Publish/s", num: true, value: r("publish"), render: (row) => rate(r("publish")(row)) },
    { key: "deliver", label: "Deliver/s", num: true, value: r("deliver"), render: (row) => rate(r("deliver")(row)) },
    { key: "ack", label: "Ack/s", num: true, value: r("ack"), render: (row) => rate(r("ack")(row)) },
    { key: "groups", label: "Groups", num: true },
    { key: "pending", label: "Pending", num: true, render: (row) => num(row.pending) },
    { key: "in_flight", label: "In flight", num: true, render: (row) => num(row.in_flight) },
    { key: "dead", label: "Dead-lettered", num: true, value: (row) => row.group_counters.dead_lettered ?? 0,
      render: (row) => num(row.group_counters.dead_lettered ?? 0) },
    { key: "oldest", label: "Oldest unsettled", num: true, value: (row) => row.oldest_unsettled_age_ms,
      render: (row) => age(row.oldest_unsettled_age_ms) },
  ], { sortKey: "topic", desc: false, empty: "no topics (that this token may see)", rowKey: (row) => row.topic });

  const filter = h("input", { type: "search", id: "filter", placeholder: "filter (press /)", "aria-label": "Filter topics" });
  filter.addEventListener("input", draw);
  const name = h("input", { id: "new-topic", name: "topic", placeholder: "new topic name", required: true,
    pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,127}" });
  const msg = h("p", { class: "msg", role: "status" });
  const canCreate = may("admin");
  const create = h("form", { class: "inline", id: "create-topic", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const res = await api("POST", "/topics", { topic: name.value.trim() });
      say(msg, res.created ? `Created ${res.topic}.` : `${res.topic} already exists.`, true);
      name.value = "";
      await loadTopics();
      draw();
    } catch (err) {
      say(msg, err.message, false);
    }
  } },
  h("label", {}, "Create a topic", name),
  h("button", { type: "submit", class: "primary", disabled: !canCreate,
    title: canCreate ? "" : "this token has no admin right" }, "Create"));
  if (!canCreate) name.disabled = true;

  main.replaceChildren(h("h1", {}, "Topics"),
    h("div", { class: "row" }, filter, h("span", { class: "spacer" }), create), msg,
    h("p", { class: "muted", id: "topic-count" }), table.el);
  function draw() {
    const f = filter.value.trim().toLowerCase();
    const rows = f ? state.topics.filter((t) => t.topic.toLowerCase().includes(f)) : state.topics;
    document.getElementById("topic-count").textContent =
      `${rows.length} of ${state.topics.length} topics; rates from the last two samples.`;
    table.update(rows);
  }
  draw();
  return {
    async refresh() { await loadTopics(); draw(); },
    key(e) {
      if (e.key === "/") { e.preventDefault(); filter.focus(); return true; }
      return false;
    },
  };
}
