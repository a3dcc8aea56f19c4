// The JSON API, as the console calls it: the signed-in token on every request (kept in
// sessionStorage: this tab only, gone when it closes), errors as ApiError, a 401 back to
// sign-in. Also what the token may do, from the `you` of GET /cluster.

const KEY = "raftq.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const session = {
  get token() { return sessionStorage.getItem(KEY); },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  you: null, // the caller, from GET /cluster
};

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

export async function api(method, path, body) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${session.token}` };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch {
    throw new ApiError(0, "unreachable", "this node does not answer");
  }
  const data = await r.json().catch(() => null);
  if (r.status === 401) {
    onUnauthorized(data?.message || "sign in again");
    throw new ApiError(401, data?.code || "unauthorized", data?.message || "unauthorized");
  }
  if (!r.ok) {
    throw new ApiError(r.status, data?.code || "error", data?.message || `HTTP ${r.status}`);
  }
  return data;
}

export function enc(name) { return encodeURIComponent(name); }

// Topic patterns as the server reads them: "*", a name, or "<name>.*" (below <name>.).
function matches(pattern, topic) {
  if (pattern === "*") return true;
  if (pattern.endsWith(".*")) return topic.startsWith(pattern.slice(0, -1));
  return pattern === topic;
}

// May the signed-in token do `action` ("publish", "consume", "admin", "cluster") on `topic`?
// Only to show and enable what it may: the server decides.
export function may(action, topic) {
  const you = session.you;
  if (!you) return false;
  if (you.all) return true;
  if (action === "cluster") return Boolean(you.cluster);
  return (you.grants || []).some(
    (g) => g.actions.includes(action) && (topic === undefined || matches(g.topics, topic)),
  );
}
