// One topic: its groups, its config (edit it), publish a test message, peek.

import { api, enc, may } from "./api.js";
import { age, bytes, h, num, say, time } from "./dom.js";

// Retained messages as a table (also the dead-letter page's): the broker's x-raftq-* headers
// (dead-letter history) first.
export function messagesTable(msgs) {
  if (!msgs.length) return h("p", { class: "muted" }, "No retained messages.");
  const rows = msgs.map((m) => {
    const names = Object.keys(m.headers || {}).sort((a, b) =>
      Number(b.startsWith("x-raftq-")) - Number(a.startsWith("x-raftq-")) || a.localeCompare(b));
    return h("tr", { "data-seq": m.seq },
      h("td", { class: "num" }, num(m.seq)),
      h("td", {}, time(m.published_at)),
      h("td", { class: "headers" }, names.length
        ? names.map((k) => h("span", { class: "mono" }, h("strong", {}, k), "=", m.headers[k]))
        : h("span", { class: "muted" }, "—")),
      h("td", { class: "payload mono", title: m.text ?? m.payload },
        m.text !== undefined ? m.text : h("span", { class: "muted" }, `base64 ${m.payload}`)));
  });
  return h("div", { class: "table-wrap" }, h("table", { id: "messages" },
    h("thead", {}, h("tr", {}, h("th", { class: "num" }, "Seq"), h("th", {}, "Published"),
      h("th", {}, "Headers"), h("th", {}, "Payload"))),
    h("tbody", {}, rows)));
}

export async function peek(topic, { from, limit = 20 } = {}) {
  const q = new URLSearchParams({ limit: String(limit), payload_encoding: "utf-8" });
  if (from) q.set("from_seq", String(from));
  return (await api("GET", `/topics/${enc(topic)}/messages?${q}`)).messages;
}

const GROUP_COLS = [
  ["pending", "Pending"], ["in_flight", "In flight"], ["delayed", "Delayed"],
  ["acked_total", "Acked"], ["dead_lettered_total", "Dead-lettered"], ["consumers", "Consumers"],
];

function groupRows(groups) {
  if (!groups.length) return [h("tr", {}, h("td", { colSpan: 10, class: "muted" }, "no groups"))];
  return groups.map((g) => {
    const lag = g.pending + g.delayed + g.in_flight;
    return h("tr", { "data-group": g.group },
      h("td", {}, h("strong", {}, g.group)),
      GROUP_COLS.map(([k]) => h("td", { class: "num", "data-col": k }, num(g[k]))),
      h("td", { class: "num", "data-col": "lag" }, num(lag)),
      h("td", { class: "num" }, age(g.oldest_age_ms)),
      h("td", { class: "mono muted" }, `timeout ${g.config.visibility_timeout}s, attempts ${g.config.max_attempts || "∞"}, dlq ${g.config.dead_letter_topic ?? "none"}`));
  });
}

// A config value as typed: "" is null (none), JSON for maps and lists ({...} or [...]),
// numbers as numbers, anything else as text (the server names what it refuses).
function parseValue(raw, was) {
  if (raw === "") return null;
  if (/^[{[]/.test(raw)) {
    try { return JSON.parse(raw); } catch { return raw; }
  }
  if (typeof was === "string") return raw;
  const n = Number(raw);
  return Number.isNaN(n) ? raw : n;
}

function configInput(k, v) {
  if (k === "overflow") {
    return h("select", { name: k }, ["reject", "drop_oldest"].map((o) => h("option", { value: o, selected: o === v }, o)));
  }
  if (typeof v === "boolean") return h("input", { name: k, type: "checkbox", checked: v });
  const text = v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
  return h("input", { name: k, value: text, placeholder: "none", class: typeof v === "object" && v !== null ? "mono" : "" });
}

// A config editor for PATCH ``path`` (a topic's or a group's): only changed values are sent.
function configForm(path, id, config, canEdit, msg, onSaved) {
  const inputs = Object.keys(config).sort().map((k) => {
    const input = configInput(k, config[k]);
    input.disabled = !canEdit;
    return [k, input];
  });
  return h("form", { class: "panel", id, onsubmit: async (e) => {
    e.preventDefault();
    const changed = {};
    for (const [k, input] of inputs) {
      const value = input.type === "checkbox" ? input.checked : parseValue(input.value.trim(), config[k]);
      if (JSON.stringify(value) !== JSON.stringify(config[k])) changed[k] = value;
    }
    if (!Object.keys(changed).length) { say(msg, "Nothing changed.", true); return; }
    try {
      await api("PATCH", path, { config: changed });
      say(msg, `Saved: ${Object.keys(changed).join(", ")}.`, true);
      onSaved();
    } catch (err) {
      say(msg, err.message, false);
    }
  } },
  h("div", { class: "row" }, inputs.map(([k, input]) => h("label", {}, k, input))),
  h("div", { class: "row end" }, h("button", { type: "submit", class: "primary", disabled: !canEdit,
    title: canEdit ? "" : "needs admin on this topic" }, "Save config")));
}

export function topicPage(main, name) {
  const summary = h("p", { class: "muted", id: "topic-line" });
  const groups = h("tbody", { id: "groups" });
  const configSlot = h("div");
  const configMsg = h("p", { class: "msg", role: "status", id: "config-msg" });
  const groupSlot = h("div", { id: "group-configs" });
  const groupMsg = h("p", { class: "msg", role: "status", id: "group-config-msg" });
  const canPublish = may("publish", name);
  const canAdmin = may("admin", name);

  const text = h("textarea", { id: "publish-text", name: "text", placeholder: "message text", disabled: !canPublish });
  const key = h("input", { id: "publish-key", name: "key", placeholder: "idempotency key (optional)", disabled: !canPublish });
  const pubMsg = h("p", { class: "msg", role: "status" });
  const publish = h("form", { class: "panel", id: "publish", onsubmit: async (e) => {
    e.preventDefault();
    const body = { text: text.value };
    if (key.value.trim()) body.key = key.value.trim();
    try {
      const res = await api("POST", `/topics/${enc(name)}/messages`, body);
      say(pubMsg, `Published as seq ${res.seq}${res.duplicate ? " (a duplicate: stored once)" : ""}.`, true);
      refresh();
    } catch (err) {
      say(pubMsg, err.message, false);
    }
  } },
  h("h2", {}, "Publish a test message"),
  h("div", { class: "row" }, h("label", {}, "Text", text), h("label", {}, "Key", key),
    h("button", { type: "submit", class: "primary", disabled: !canPublish,
      title: canPublish ? "" : "needs publish on this topic" }, "Publish")),
  pubMsg);

  const from = h("input", { id: "peek-from", type: "number", min: "0", placeholder: "oldest", disabled: !canAdmin });
  const peekSlot = h("div", { id: "peek-result" });
  const peekMsg = h("p", { class: "msg", role: "status" });
  const peekForm = h("form", { class: "panel", id: "peek", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const msgs = await peek(name, { from: from.value ? Number(from.value) : undefined });
      peekSlot.replaceChildren(messagesTable(msgs));
      say(peekMsg, `${msgs.length} message(s).`, true);
    } catch (err) {
      say(peekMsg, err.message, false);
    }
  } },
  h("h2", {}, "Peek"),
  h("div", { class: "row" }, h("label", {}, "From seq", from),
    h("button", { type: "submit", disabled: !canAdmin, title: canAdmin ? "" : "needs admin on this topic" }, "Peek")),
  peekMsg, peekSlot);

  main.replaceChildren(
    h("p", {}, h("a", { href: "#/topics" }, "← Topics")),
    h("h1", {}, name), summary,
    h("h2", {}, "Groups"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Group"), GROUP_COLS.map(([, t]) => h("th", { class: "num" }, t)),
        h("th", { class: "num", title: "pending + delayed + in flight" }, "Lag"), h("th", { class: "num" }, "Oldest"), h("th", {}, "Config"))),
      groups)),
    h("h2", {}, "Config"), configSlot, configMsg,
    h("h2", {}, "Group config"), groupSlot, groupMsg,
    h("div", { class: "two" }, publish, peekForm),
  );
  let shownConfig = null;
  let shownGroups = null;
  async function refresh() {
    const t = await api("GET", `/topics/${enc(name)}`);
    summary.textContent = `${num(t.messages)} messages, ${bytes(t.bytes)}, seq ${t.first_seq ?? "—"}…${t.last_seq}, `
      + `oldest ${age(t.oldest_age_ms)}, published ${num(t.published_total)}.`;
    groups.replaceChildren(...groupRows(t.groups));
    const cfg = JSON.stringify(t.config);
    if (cfg !== shownConfig) { // (redrawn only when it changed: never under the user's typing)
      shownConfig = cfg;
      configSlot.replaceChildren(configForm(`/topics/${enc(name)}`, "config", t.config, canAdmin, configMsg,
        () => { shownConfig = null; refresh(); }));
    }
    const gcfg = JSON.stringify(t.groups.map((g) => [g.group, g.config]));
    if (gcfg !== shownGroups) { // (one editor per group, in a collapsed section)
      shownGroups = gcfg;
      const open = new Set([...groupSlot.querySelectorAll("details[open]")].map((d) => d.dataset.group));
      groupSlot.replaceChildren(...t.groups.map((g) => h("details", { "data-group": g.group, open: open.has(g.group) },
        h("summary", {}, g.group),
        configForm(`/topics/${enc(name)}/groups/${enc(g.group)}`, `group-config-${g.group}`, g.config, canAdmin,
          groupMsg, () => { shownGroups = null; refresh(); }))));
    }
  }
  return { refresh };
}
