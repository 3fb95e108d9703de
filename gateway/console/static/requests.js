// Recent requests: newest rows are added on top and old ones never move, so a selected
// (or focused) row stays put while the list refreshes. A selected row shows its timeline.

import { clock, el, seconds } from "./format.js";

const SEGMENTS = [
  ["routing", "routing", "arrival_time", "queue_start_time"],
  ["queue", "queue", "queue_start_time", "inference_start_time"],
  ["prefill", "to first token", "inference_start_time", "first_token_time"],
  ["decode", "decode", "first_token_time", "finish_time"],
];
const MAX_ROWS = 100;

export class RequestsView {
  constructor(table, timeline) {
    this.body = table.tBodies[0];
    this.timeline = timeline;
    this.rows = new Map(); // request id -> {tr, record}
    this.selected = null;
    this.body.addEventListener("click", (event) => this.pick(event.target.closest("tr")));
    this.body.addEventListener("keydown", (event) => this.onKey(event));
  }

  reset() {
    this.body.replaceChildren();
    this.rows.clear();
  }

  render(records) {
    const fresh = records.filter((record) => !this.rows.has(record.request_id));
    // `records` is newest first: insert the fresh ones on top in that order.
    const anchor = this.body.firstChild;
    for (const record of fresh) {
      const tr = this.makeRow(record);
      this.rows.set(record.request_id, { tr, record });
      this.body.insertBefore(tr, anchor);
    }
    while (this.body.rows.length > MAX_ROWS) {
      const last = this.body.lastElementChild;
      this.rows.delete(last.dataset.id);
      last.remove();
    }
    if (!this.body.rows.length) {
      const tr = el("tr", "", "empty");
      const td = el("td", "No requests yet.", "muted");
      td.colSpan = 9;
      tr.append(td);
      this.body.append(tr);
    } else {
      this.body.querySelector("tr.empty")?.remove();
    }
  }

  makeRow(r) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.request_id;
    tr.tabIndex = 0;
    tr.setAttribute("aria-current", "false");
    const status = el("span", r.status, `badge ${r.status}`);
    const statusCell = el("td");
    statusCell.append(status);
    const tokens = `${r.input_tokens} / ${r.output_tokens}`;
    tr.append(
      el("td", clock(r.finish_time)),
      el("td", r.request_id.slice(0, 12), "mono"),
      el("td", r.model),
      statusCell,
      el("td", seconds(r.queue_s), "num"),
      el("td", seconds(r.ttft_s), "num"),
      el("td", seconds(r.e2e_s), "num"),
      el("td", tokens, "num"),
      el("td", r.error_type ?? "", "error-text"),
    );
    return tr;
  }

  onKey(event) {
    const tr = event.target.closest("tr");
    if (!tr) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      this.pick(tr);
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const next = event.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
      next?.focus();
    }
  }

  pick(tr) {
    const entry = tr && this.rows.get(tr.dataset.id);
    if (!entry) return;
    for (const row of this.body.querySelectorAll('tr[aria-current="true"]')) {
      row.setAttribute("aria-current", "false");
    }
    tr.setAttribute("aria-current", "true");
    this.selected = entry.record.request_id;
    this.showTimeline(entry.record);
  }

  showTimeline(r) {
    const box = this.timeline;
    box.replaceChildren();
    const total = Math.max(1e-6, r.finish_time - r.arrival_time);
    box.append(el("h3", `Request ${r.request_id}`));
    const bar = el("div", "", "bar");
    bar.setAttribute("role", "img");
    const legend = el("ul", "", "legend");
    const said = [];
    for (const [key, label, from, to] of SEGMENTS) {
      if (r[from] === null || r[to] === null) continue;
      const span = Math.max(0, r[to] - r[from]);
      const seg = el("div", "", `seg ${key}`);
      seg.style.width = `${(100 * span) / total}%`;
      seg.title = `${label}: ${seconds(span)}`;
      bar.append(seg);
      const item = el("li");
      item.append(el("span", "", `swatch seg ${key}`), document.createTextNode(`${label} ${seconds(span)}`));
      legend.append(item);
      said.push(`${label} ${seconds(span)}`);
    }
    bar.setAttribute("aria-label", `Timeline: ${said.join(", ")}; total ${seconds(total)}`);
    const facts = el(
      "p",
      `${r.model} via ${r.backend ?? "?"} · ${r.status}${r.error_type ? ` (${r.error_type})` : ""}` +
        ` · ${r.input_tokens} in / ${r.output_tokens} out · ITL ${seconds(r.itl_s)} · total ${seconds(total)}` +
        (r.fallback_from ? ` · fell back from ${r.fallback_from.join(", ")}` : ""),
      "muted small",
    );
    box.append(bar, legend, facts);
    box.hidden = false;
  }
}
