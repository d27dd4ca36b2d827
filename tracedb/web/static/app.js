// tracedb's web view: copy buttons, the payload viewer, more rows, and live updates of a running
// execution. Plain JavaScript; every recorded value is put on the page as text (textContent),
// never as HTML. Server-rendered fragments (rows, the timeline) are escaped by the server.
"use strict";

(function () {
  const LARGE_BYTES = 256 * 1024;  // payloads above this ask before they are drawn
  const POLL_MS = 1000;

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } finally { area.remove(); }
    return Promise.resolve();
  }

  function flash(button) {
    const label = button.textContent;
    button.classList.add("done");
    button.textContent = "Copied";
    setTimeout(() => { button.classList.remove("done"); button.textContent = label; }, 1200);
  }

  document.addEventListener("click", (ev) => {
    const copy = ev.target.closest("button.copy");
    if (copy) {
      ev.stopPropagation();
      copyText(copy.dataset.copy || "").then(() => flash(copy), () => flash(copy));
      return;
    }
    const more = ev.target.closest("button.more");
    if (more) { loadMore(more); return; }
    if (ev.target.closest("a")) return;
    const row = ev.target.closest("tr.ev");
    if (row) togglePayload(row);
  });

  // -- folded JSON ----------------------------------------------------------------------------

  function span(cls, text) {
    const s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }

  function scalar(value) {
    if (value === null) return span("z", "null");
    switch (typeof value) {
      case "string": return span("s", JSON.stringify(value));
      case "number": return span("n", String(value));
      case "boolean": return span("b", String(value));
      default: return span("z", String(value));
    }
  }

  function tree(value, key, depth) {
    const isArr = Array.isArray(value);
    if (value === null || typeof value !== "object") {
      const row = document.createElement("div");
      row.className = "row";
      if (key !== null) { row.appendChild(span("k", JSON.stringify(key))); row.appendChild(document.createTextNode(": ")); }
      row.appendChild(scalar(value));
      return row;
    }
    const entries = isArr ? value.map((v, i) => [i, v]) : Object.entries(value);
    const box = document.createElement("details");
    if (depth < 2 || entries.length <= 3) box.open = true;
    const sum = document.createElement("summary");
    if (key !== null) { sum.appendChild(span("k", JSON.stringify(key))); sum.appendChild(document.createTextNode(": ")); }
    sum.appendChild(document.createTextNode(isArr ? "[" : "{"));
    sum.appendChild(span("c", ` ${entries.length} ${isArr ? (entries.length === 1 ? "item" : "items") : (entries.length === 1 ? "key" : "keys")} `));
    sum.appendChild(document.createTextNode(isArr ? "]" : "}"));
    box.appendChild(sum);
    for (const [k, v] of entries) box.appendChild(tree(v, isArr ? null : k, depth + 1));
    return box;
  }

  function showPayload(cell, doc) {
    cell.textContent = "";
    const head = document.createElement("div");
    head.className = "payload-head";
    head.appendChild(span("", `#${doc.seq} ${doc.type} · recorded ${doc.recorded} · ${doc.size.toLocaleString()} bytes`));
    const text = JSON.stringify(doc.payload, null, 2);
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "copy";
    btn.dataset.copy = text;
    btn.textContent = "Copy JSON";
    head.appendChild(btn);
    cell.appendChild(head);
    const box = document.createElement("div");
    box.className = "jtree";
    box.appendChild(tree(doc.payload, null, 0));
    cell.appendChild(box);
  }

  function togglePayload(row) {
    const next = row.nextElementSibling;
    if (next && next.classList.contains("payload")) {
      next.remove();
      row.classList.remove("open");
      return;
    }
    row.classList.add("open");
    const tr = document.createElement("tr");
    tr.className = "payload";
    const cell = document.createElement("td");
    cell.colSpan = 5;
    tr.appendChild(cell);
    row.after(tr);
    const size = parseInt(row.dataset.size || "0", 10);
    const load = () => {
      cell.textContent = "loading…";
      fetch(row.dataset.src, { headers: { accept: "application/json" } })
        .then((r) => (r.ok ? r.json() : Promise.reject(new Error(r.status + " " + r.statusText))))
        .then((doc) => showPayload(cell, doc))
        .catch((e) => { cell.textContent = "could not load the payload: " + e.message; });
    };
    if (size > LARGE_BYTES) {
      cell.textContent = "";
      cell.appendChild(span("", `A large payload (${(size / 1048576).toFixed(1)} MiB). `));
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = "Show it";
      b.addEventListener("click", (e) => { e.stopPropagation(); load(); });
      cell.appendChild(b);
    } else {
      load();
    }
  }

  // -- more rows ------------------------------------------------------------------------------

  function appendRows(html, fresh) {
    const body = document.getElementById("event-rows");
    const tpl = document.createElement("template");
    tpl.innerHTML = html;  // built and escaped by the server
    const rows = Array.from(tpl.content.querySelectorAll("tr"));
    for (const r of rows) {
      const old = document.getElementById(r.id);
      if (fresh) r.classList.add("fresh");
      if (old) old.replaceWith(r); else body.appendChild(r);
    }
    return rows.length;
  }

  function loadMore(button) {
    button.disabled = true;
    fetch(`${button.dataset.src}&after=${button.dataset.after}`)
      .then((r) => r.json())
      .then((doc) => {
        appendRows(doc.html, false);
        button.dataset.after = doc.last_seq;
        button.disabled = false;
        if (!doc.more) button.remove();
      })
      .catch(() => { button.disabled = false; });
  }

  // -- live -----------------------------------------------------------------------------------

  function live() {
    const root = document.getElementById("execution");
    if (!root || root.dataset.status !== "running") return;
    const src = root.dataset.liveSrc;
    const tick = () => {
      const after = root.dataset.lastSeq;
      fetch(`${src}&after=${after}&status=${encodeURIComponent(root.dataset.status)}`)
        .then((r) => (r.ok ? r.json() : Promise.reject(new Error(String(r.status)))))
        .then((doc) => {
          if (doc.reload) { window.location.reload(); return; }
          if (doc.changed) {
            // Replace rows that changed (a request that got its answer) and add the new ones.
            if (!document.querySelector("button.more")) appendRows(doc.rows, true);
            root.dataset.lastSeq = doc.last_seq;
            const count = document.querySelector(".n-events");
            if (count) count.textContent = doc.events;
            const ov = document.querySelector(".overview");
            if (ov && doc.overview) {
              const tpl = document.createElement("template");
              tpl.innerHTML = doc.overview;  // server-rendered SVG, escaped
              ov.replaceChildren(tpl.content);
            }
            const spans = document.querySelector(".spans");
            if (spans && doc.spans !== undefined) {
              const tpl = document.createElement("template");
              tpl.innerHTML = doc.spans;  // server-rendered SVG, escaped
              spans.replaceChildren(tpl.content);
            }
          }
          setTimeout(tick, POLL_MS);
        })
        .catch(() => setTimeout(tick, POLL_MS * 3));
    };
    setTimeout(tick, POLL_MS);
  }

  // -- counts per status (after the page: on millions of executions they take longer) -------

  function counts() {
    const box = document.querySelector(".counts[data-src]");
    if (!box) return;
    fetch(box.dataset.src)
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(String(r.status)))))
      .then((doc) => {
        let all = 0, capped = false;
        for (const [status, n] of Object.entries(doc.counts)) {
          const b = box.querySelector(`.chip[data-status="${status}"] .n`);
          if (b) b.textContent = doc.shown[status];
          all += Math.min(n, doc.limit);
          capped = capped || n > doc.limit;
        }
        const a = box.querySelector('.chip[data-status="all"] .n');
        if (a) a.textContent = all.toLocaleString("en-US") + (capped ? "+" : "");
        const total = document.querySelector(".pager .total .n");
        if (total) total.textContent = doc.total;
        box.classList.add("loaded");
      })
      .catch(() => { for (const b of box.querySelectorAll(".n")) b.textContent = "?"; });
  }

  function start() { live(); counts(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
