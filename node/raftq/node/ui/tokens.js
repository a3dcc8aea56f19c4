// Tokens (a cluster token only): list, create (the secret shown once), revoke.

import { api, enc } from "./api.js";
import { confirmDialog, h, say, time } from "./dom.js";

// "orders.*=consume,publish" lines as grants.
function parseGrants(text) {
  return text.split("\n").map((l) => l.trim()).filter(Boolean).map((line) => {
    const [topics, actions = ""] = line.split("=");
    return { topics: topics.trim(), actions: actions.split(",").map((a) => a.trim()).filter(Boolean) };
  });
}

const grantText = (grants) => grants.map((g) => `${g.topics}=${g.actions.join(",")}`).join("  ");

export function tokensPage(main) {
  const list = h("tbody", { id: "token-list" });
  const listMsg = h("p", { class: "msg", role: "status" });
  const name = h("input", { id: "token-name", name: "name", required: true, placeholder: "billing-worker" });
  const grants = h("textarea", { id: "token-grants", name: "grants", placeholder: "billing.*=consume\naudit=publish" });
  const cluster = h("input", { id: "token-cluster", name: "cluster", type: "checkbox" });
  const created = h("div", { id: "token-created" });
  const msg = h("p", { class: "msg", role: "status" });
  const form = h("form", { class: "panel", id: "create-token", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const res = await api("POST", "/tokens", { name: name.value.trim(), grants: parseGrants(grants.value), cluster: cluster.checked });
      created.replaceChildren(h("p", {}, `Token ${res.name} (${res.id}) created. Copy it now: it is shown only once.`),
        h("div", { class: "secret mono", id: "token-secret" }, res.token));
      say(msg, "", true);
      form.reset();
      await refresh();
    } catch (err) { say(msg, err.message, false); }
  } },
  h("h2", {}, "Create a token"),
  h("div", { class: "row" }, h("label", {}, "Name", name),
    h("label", {}, "Grants, one a line: topics=actions (publish, consume, admin)", grants),
    h("label", {}, "Cluster (members, tokens)", cluster),
    h("button", { type: "submit", class: "primary" }, "Create")),
  msg, created);

  main.replaceChildren(h("h1", {}, "Tokens"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Name", "Id", "Grants", "Cluster", "Created", "Expires", "State", ""].map((t) => h("th", {}, t)))),
      list)),
    listMsg, form);

  async function refresh() {
    const { tokens } = await api("GET", "/tokens");
    list.replaceChildren(...(tokens.length ? tokens.map((t) => h("tr", { "data-token": t.name },
      h("td", {}, h("strong", {}, t.name)), h("td", { class: "mono" }, t.id),
      h("td", { class: "mono" }, grantText(t.grants || []) || "—"),
      h("td", {}, t.cluster ? "yes" : ""), h("td", {}, time(t.created_at)), h("td", {}, time(t.expires_at)),
      h("td", {}, t.disabled ? h("span", { class: "bad" }, "disabled") : "active"),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: async () => {
        if (!(await confirmDialog(`Revoke token ${t.name} (${t.id})? Every node refuses it at once.`))) return;
        try {
          await api("DELETE", `/tokens/${enc(t.id)}`);
          say(listMsg, `Revoked ${t.name}.`, true);
          await refresh();
        } catch (err) { say(listMsg, err.message, false); }
      } }, "Revoke")))) : [h("tr", {}, h("td", { colSpan: 8, class: "muted" }, "no tokens (the bootstrap admin token is configuration)"))]));
  }
  return { refresh };
}
