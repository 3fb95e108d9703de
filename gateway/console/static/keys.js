// Client keys: what each spent (this replica, since it started) and where its budget
// stands (the limit store's, over every replica), from /admin/usage. Rebuilt from each
// answer: one row per configured key, none of them focusable.

import { count, el, usd } from "./format.js";

function budgetCell(budget) {
  if (!budget) return el("td", "none", "muted");
  const td = el("td", "", "progress-cell");
  const bar = document.createElement("progress");
  bar.max = budget.max_budget;
  bar.value = Math.min(budget.spent, budget.max_budget);
  const words = `${usd(budget.spent)} of ${usd(budget.max_budget)} this ${budget.period}`;
  bar.setAttribute("aria-label", words);
  td.append(bar, el("span", words, "small"));
  return td;
}

export class KeysView {
  constructor(table) {
    this.body = table.tBodies[0];
  }

  render(usage) {
    const rows = usage.keys.map((key) => {
      const tr = document.createElement("tr");
      tr.dataset.key = key.name;
      const requests = Object.values(key.requests).reduce((a, b) => a + b, 0);
      const tokens = `${count(key.tokens.prompt ?? 0)} / ${count(key.tokens.completion ?? 0)}`;
      const resets = key.budget ? key.budget.resets_at.replace("T", " ").replace("Z", " UTC") : "–";
      tr.append(
        el("td", key.name),
        el("td", String(requests), "num"),
        el("td", tokens, "num"),
        el("td", usd(key.spend.usd), "num spend"),
        budgetCell(key.budget),
        el("td", resets),
      );
      return tr;
    });
    if (!rows.length) {
      const tr = el("tr", "", "empty");
      const td = el("td", "No client keys (auth.required is off).", "muted");
      td.colSpan = 6;
      tr.append(td);
      rows.push(tr);
    }
    this.body.replaceChildren(...rows);
  }
}
