// The console's shell: sign-in, the hash router (#/overview, #/topics, #/topic/<name>,
// #/dlq[/<name>], #/tokens), the poll loop (the shown page refreshes every POLL_MS while the
// tab is visible) and keyboard shortcuts (o t d k: pages, r: refresh, /: filter).

import { ApiError, session, whenUnauthorized } from "./api.js";
import { forget, loadCluster } from "./data.js";
import { dlqPage } from "./dlq.js";
import { overview } from "./overview.js";
import { signin } from "./signin.js";
import { topicPage } from "./topic.js";
import { tokensPage } from "./tokens.js";
import { topics } from "./topics.js";

const POLL_MS = 3000;
const main = document.getElementById("main");
const banner = document.getElementById("banner");
let page = null;
let busy = null; // the page whose refresh is under way

function showBanner(text) {
  banner.textContent = text || "";
  banner.hidden = !text;
}

function signOut(why) {
  session.token = null;
  session.you = null;
  forget();
  page = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("who").textContent = "";
  showBanner("");
  if (location.hash !== "#/signin") history.replaceState(null, "", "#/signin");
  signin(main, { why, onSignedIn });
}

async function onSignedIn() {
  const c = await loadCluster();
  session.you = c.you;
  document.getElementById("nav").hidden = false;
  document.getElementById("signout").hidden = false;
  document.getElementById("nav-tokens").hidden = !c.you.cluster;
  document.getElementById("who").textContent = `${c.you.name} @ ${c.node}`;
  if (!location.hash || location.hash === "#/signin") location.hash = "#/overview";
  else route();
}

function route() {
  if (!session.token) { signOut(); return; }
  if (!session.you) { onSignedIn().catch((err) => signOut(err.message)); return; }
  const [, name = "overview", arg] = location.hash.match(/^#\/([a-z]+)\/?(.*)$/) || [];
  const param = arg ? decodeURIComponent(arg) : undefined;
  const pages = {
    overview: () => overview(main),
    topics: () => topics(main),
    topic: () => topicPage(main, param),
    dlq: () => dlqPage(main, param),
    tokens: () => tokensPage(main),
  };
  if (name === "signin") { signOut(); return; }
  page = (pages[name] || pages.overview)();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === (name === "topic" ? "topics" : name));
  }
  document.title = `raftq · ${name}${param ? ` ${param}` : ""}`;
  main.focus({ preventScroll: true });
  refresh();
}

async function refresh() {
  if (!page || busy === page) return;
  const shown = page;
  busy = shown;
  try {
    await shown.refresh();
    showBanner("");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return; // (back at sign-in already)
    showBanner(err.status === 0 ? `${location.host} does not answer; retrying every ${POLL_MS / 1000} s`
      : `${err.message}`);
  } finally {
    if (busy === shown) busy = null;
  }
}

// (while signing in, the sign-in form says why itself)
whenUnauthorized((why) => { if (session.you) signOut(`Signed out: ${why}`); });
window.addEventListener("hashchange", route);
document.getElementById("signout").addEventListener("click", () => signOut());
setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
document.addEventListener("keydown", (e) => {
  const t = e.target;
  if (e.ctrlKey || e.metaKey || e.altKey || !session.you) return;
  if (t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || t instanceof HTMLSelectElement) return;
  if (page?.key?.(e)) return;
  const go = { o: "#/overview", t: "#/topics", d: "#/dlq", k: "#/tokens" }[e.key];
  if (go) location.hash = go;
  else if (e.key === "r") refresh();
});
route();
