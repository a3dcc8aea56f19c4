// Sign in with a token: checked with GET /cluster (which also says what the token may do).

import { ApiError, session } from "./api.js";
import { h, say } from "./dom.js";

export function signin(main, { why, onSignedIn }) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off",
    placeholder: "rq_<id>.<secret>", required: true, spellcheck: false });
  const msg = h("p", { class: "msg", role: "alert" });
  if (why) say(msg, why, false);
  const form = h("form", { class: "panel signin", onsubmit: async (e) => {
    e.preventDefault();
    session.token = input.value.trim();
    try {
      await onSignedIn();
    } catch (err) {
      session.token = null;
      say(msg, err instanceof ApiError && err.status === 401 ? `Token refused: ${err.message}` : err.message, false);
      input.select();
    }
  } },
  h("h1", {}, "Sign in"),
  h("label", { for: "token" }, "API token", input),
  h("p", { class: "muted" }, "Kept in this tab only (session storage), sent to this node as a bearer token. ",
    "make run keeps an admin token in .raftq/admin.token; raftq token create makes narrower ones."),
  h("div", { class: "row end" }, h("button", { class: "primary", type: "submit" }, "Sign in")),
  msg);
  main.replaceChildren(form);
  input.focus();
}
