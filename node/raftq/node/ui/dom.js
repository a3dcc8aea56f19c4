// Small DOM helpers (text nodes only, never HTML strings: names and payloads are user data),
// formatting, the confirmation dialog and the SVG sparklines.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const NF = new Intl.NumberFormat("en");
export function num(n) { return n === null || n === undefined ? "—" : NF.format(n); }

export function rate(r) {
  if (r === null || r === undefined) return "—";
  if (r === 0) return "0";
  return r >= 100 ? NF.format(Math.round(r)) : r.toFixed(r >= 10 ? 1 : 2);
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function age(ms) {
  if (ms === null || ms === undefined) return "—";
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function time(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "—";
}

// A message line under a form: ok (green) or error (red).
export function say(el, text, ok) {
  el.textContent = text;
  el.className = `msg ${ok ? "ok" : "error"}`;
}

// Ask before something that cannot be undone; resolves true on Confirm.
export function confirmDialog(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.showModal();
  document.getElementById("confirm-cancel").focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

// A sortable table: columns [{key, label, num, render(row)}]; the header's buttons sort it
// (click or Enter; again to reverse). Returns {el, update(rows)}.
export function sortableTable(columns, { sortKey, desc = true, empty = "nothing here", rowKey } = {}) {
  let key = sortKey || columns[0].key;
  let descending = desc;
  let rows = [];
  const tbody = h("tbody");
  const ths = columns.map((c) => {
    const th = h("th", { class: c.num ? "num" : "", scope: "col" },
      h("button", { class: "sort", type: "button", onclick: () => {
        descending = key === c.key ? !descending : Boolean(c.num);
        key = c.key;
        draw();
      } }, c.label));
    th.dataset.key = c.key;
    return th;
  });
  const table = h("table", {}, h("thead", {}, h("tr", {}, ths)), tbody);
  function value(row, k) {
    const col = columns.find((c) => c.key === k);
    return col.value ? col.value(row) : row[k];
  }
  function draw() {
    for (const th of ths) {
      th.setAttribute("aria-sort", th.dataset.key === key ? (descending ? "descending" : "ascending") : "none");
    }
    const sorted = [...rows].sort((a, b) => {
      const x = value(a, key), y = value(b, key);
      const c = x === y ? 0 : x === null || x === undefined ? -1 : y === null || y === undefined ? 1 : x < y ? -1 : 1;
      return descending ? -c : c;
    });
    if (!sorted.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colSpan: columns.length, class: "muted" }, empty)));
      return;
    }
    tbody.replaceChildren(...sorted.map((row) => {
      const tr = h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : "" },
        c.render ? c.render(row) : String(row[c.key] ?? "—"))));
      if (rowKey) tr.dataset.key = rowKey(row);
      return tr;
    }));
  }
  return { el: h("div", { class: "table-wrap" }, table), update(r) { rows = r; draw(); } };
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

// A small line chart of `values` (numbers or null), newest last.
export function sparkline(values, points = 60) {
  const w = 120, hgt = 40;
  const vs = values.slice(-points).map((v) => v ?? 0);
  const max = Math.max(1e-9, ...vs);
  const step = w / Math.max(1, points - 1);
  const x0 = w - step * (vs.length - 1);
  const coords = vs.map((v, i) => `${(x0 + i * step).toFixed(1)},${(hgt - 2 - (v / max) * (hgt - 4)).toFixed(1)}`);
  const root = svg("svg", { viewBox: `0 0 ${w} ${hgt}`, preserveAspectRatio: "none", role: "img" });
  if (coords.length > 1) {
    root.append(svg("polygon", { class: "area", points: `${x0},${hgt} ${coords.join(" ")} ${w},${hgt}` }));
    root.append(svg("polyline", { points: coords.join(" ") }));
  }
  return root;
}
