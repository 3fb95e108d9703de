// Batches: every key's batches, newest first, each with its progress. The table is
// rebuilt from each answer (at most a page of rows, none of them focusable), so a
// batch's status and counts are always the store's.

import { ago, el } from "./format.js";

const DONE = new Set(["completed", "failed", "cancelled", "expired"]);

function progressCell(b) {
  const counts = b.request_counts;
  const finished = counts.completed + counts.failed;
  const td = el("td", "", "progress-cell");
  const bar = document.createElement("progress");
  bar.max = Math.max(1, counts.total);
  bar.value = Math.min(finished, bar.max);
  const words =
    counts.total > 0
      ? `${finished} of ${counts.total} lines`
      : b.status === "validating"
        ? "validating input"
        : "no lines";
  bar.setAttribute("aria-label", `${b.id}: ${words}`);
  const notes = [];
  if (counts.failed) notes.push(`${counts.failed} failed`);
  if (counts.started && !DONE.has(b.status)) notes.push(`${counts.started} running`);
  if (b.reruns) notes.push(`${b.reruns} rerun`);
  const text = el("span", notes.length ? `${words} · ${notes.join(" · ")}` : words, "small");
  td.append(bar, text);
  return td;
}

function endedAt(b) {
  return b.completed_at ?? b.failed_at ?? b.cancelled_at ?? b.expired_at ?? null;
}

export class BatchesView {
  constructor(table) {
    this.body = table.tBodies[0];
  }

  render(batches) {
    const rows = batches.map((b) => {
      const tr = document.createElement("tr");
      tr.dataset.id = b.id;
      tr.dataset.status = b.status;
      const statusCell = el("td");
      statusCell.append(el("span", b.status, `badge ${b.status}`));
      const ended = endedAt(b);
      const idCell = el("td", b.id.slice(0, 18), "mono");
      idCell.title = b.id;
      tr.append(
        idCell,
        el("td", b.owner),
        el("td", b.endpoint, "mono"),
        statusCell,
        progressCell(b),
        el("td", ago(b.created_at)),
        el("td", ended ? ago(ended) : "–"),
      );
      return tr;
    });
    if (!rows.length) {
      const tr = el("tr", "", "empty");
      const td = el("td", "No batches yet (POST /v1/batches).", "muted");
      td.colSpan = 7;
      tr.append(td);
      rows.push(tr);
    }
    this.body.replaceChildren(...rows);
  }
}
