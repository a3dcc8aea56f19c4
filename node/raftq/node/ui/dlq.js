// Dead letters: the dead-letter topics this token sees (named <topic>.dlq, as groups make them
// by default, or any topic chosen), their messages with the x-raftq-dlq-* history, redrive
// and purge (each confirmed first).

import { api, enc, may } from "./api.js";
import { loadTopics, state } from "./data.js";
import { confirmDialog, h, num, say } from "./dom.js";
import { messagesTable, peek } from "./topic.js";

export function dlqPage(main, chosen) {
  const list = h("tbody", { id: "dlq-topics" });
  const detail = h("div", { id: "dlq-detail" });
  main.replaceChildren(h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "A message that fails max_attempts times, or is termed, goes to its group's dead-letter topic, "
      + "with headers naming its source, attempts and last reason. Redrive sends them back to their group."),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Dead-letter topic"), h("th", { class: "num" }, "Messages"), h("th", { class: "num" }, "Published"))),
      list)),
    detail);

  async function showTopic(name) {
    const canAdmin = may("admin", name);
    const msg = h("p", { class: "msg", role: "status" });
    const slot = h("div");
    async function reload() {
      if (!canAdmin) {
        slot.replaceChildren(h("p", { class: "muted" }, "Browsing dead letters needs admin on this topic."));
        return;
      }
      slot.replaceChildren(messagesTable(await peek(name, { limit: 50 })));
    }
    const redrive = h("button", { type: "button", id: "redrive", class: "primary", disabled: !canAdmin, onclick: async () => {
      if (!(await confirmDialog(`Redrive every dead letter in ${name} back to its source group?`))) return;
      try {
        const res = await api("POST", `/topics/${enc(name)}/redrive`, {});
        say(msg, `Redriven ${res.redriven}${res.skipped ? `, skipped ${res.skipped}` : ""}.`, true);
        await Promise.all([reload(), refresh()]);
      } catch (err) { say(msg, err.message, false); }
    } }, "Redrive all");
    const purge = h("button", { type: "button", id: "purge", class: "danger", disabled: !canAdmin, onclick: async () => {
      if (!(await confirmDialog(`Purge ${name}? Every retained message in it is dropped for good.`))) return;
      try {
        const res = await api("POST", `/topics/${enc(name)}/purge`, {});
        say(msg, `Purged ${res.purged}.`, true);
        await Promise.all([reload(), refresh()]);
      } catch (err) { say(msg, err.message, false); }
    } }, "Purge");
    detail.replaceChildren(h("h2", {}, name), h("div", { class: "row" }, redrive, purge), msg, slot);
    try { await reload(); } catch (err) { say(msg, err.message, false); }
  }

  async function refresh() {
    await loadTopics();
    const dlqs = state.topics.filter((t) => t.topic.endsWith(".dlq") || t.topic === chosen);
    list.replaceChildren(...(dlqs.length ? dlqs.map((t) => h("tr", { "data-topic": t.topic },
      h("td", {}, h("a", { href: `#/dlq/${encodeURIComponent(t.topic)}` }, t.topic)),
      h("td", { class: "num" }, num(t.messages)),
      h("td", { class: "num" }, num(t.counters.published)))) : [h("tr", {}, h("td", { colSpan: 3, class: "muted" }, "no dead-letter topics"))]));
  }
  if (chosen) showTopic(chosen);
  return { refresh };
}
