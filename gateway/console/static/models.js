// The models table: one persistent row per model, updated in place every poll so that
// keyboard focus on a button survives the refresh.

import { adminPost, describeError, hasAdminKey } from "./api.js";
import { ago, bytes, clock, count, el } from "./format.js";

const PENDING_LABEL = { load: "loading", unload: "unloading", drain: "draining" };
const ACTIONS = {
  load: new Set(["unloaded", "failed"]),
  unload: new Set(["loading", "ready", "active", "failed"]),
  drain: new Set(["ready", "active"]),
};

export class ModelsView {
  constructor(table, note, { onStatus, onChange }) {
    this.body = table.tBodies[0];
    this.note = note;
    this.rows = new Map();
    this.pending = new Map(); // model -> action running
    this.mutations = false;
    this.loadingSince = new Map(); // model -> Date.now() when first seen loading
    this.onStatus = onStatus;
    this.onChange = onChange;
  }

  render(payload) {
    this.mutations = Boolean(payload.mutations);
    this.note.hidden = this.mutations;
    const seen = new Set();
    for (const model of payload.models) {
      seen.add(model.name);
      let row = this.rows.get(model.name);
      if (!row) {
        row = this.makeRow(model.name);
        this.rows.set(model.name, row);
        this.body.append(row.tr);
      }
      this.fill(row, model);
    }
    for (const [name, row] of this.rows) {
      if (!seen.has(name)) {
        row.tr.remove();
        this.rows.delete(name);
      }
    }
  }

  makeRow(name) {
    const tr = document.createElement("tr");
    tr.dataset.model = name;
    const cells = {};
    const nameCell = el("td");
    nameCell.append(el("strong", name));
    cells.aliases = el("span", "", "aliases");
    cells.adapters = el("span", "", "aliases adapters");
    nameCell.append(cells.aliases, cells.adapters);
    tr.append(nameCell);
    for (const key of ["backend", "state", "inflight", "queue", "memory", "loaded", "used"]) {
      cells[key] = el("td", "", ["inflight", "queue", "memory"].includes(key) ? "num" : "");
      tr.append(cells[key]);
    }
    cells.badge = el("span", "", "badge");
    cells.detail = el("div", "", "muted small");
    cells.state.append(cells.badge, cells.detail);
    const actions = el("td");
    const group = el("div", "", "row-actions");
    group.setAttribute("role", "group");
    group.setAttribute("aria-label", `Actions for ${name}`);
    const buttons = {};
    for (const action of Object.keys(ACTIONS)) {
      const button = el("button", action[0].toUpperCase() + action.slice(1));
      button.type = "button";
      button.dataset.action = action;
      button.setAttribute("aria-label", `${action} ${name}`);
      button.addEventListener("click", () => this.act(name, action));
      buttons[action] = button;
      group.append(button);
    }
    actions.append(group);
    tr.append(actions);
    return { tr, cells, buttons, model: null };
  }

  fill(row, model) {
    row.model = model;
    const { cells } = row;
    cells.aliases.textContent = model.aliases.length ? model.aliases.join(", ") : "";
    const adapters = (model.adapters ?? []).map((a) => a.name);
    cells.adapters.textContent = adapters.length ? `LoRA: ${adapters.join(", ")}` : "";
    cells.backend.textContent = model.backend;
    const pending = this.pending.get(model.name);
    const state = pending ? `${pending}…` : model.state;
    cells.badge.textContent = state;
    cells.badge.className = `badge ${pending ? "loading" : model.state}`;
    row.tr.dataset.state = model.state;
    if (model.state !== "loading") this.loadingSince.delete(model.name);
    else if (!this.loadingSince.has(model.name)) this.loadingSince.set(model.name, Date.now());
    const since = this.loadingSince.get(model.name);
    const detail = since ? `for ${((Date.now() - since) / 1000).toFixed(0)} s` : stateDetail(model);
    // Always one line (a no-break space when empty), so rows never change height.
    cells.detail.textContent = detail || replicaSummary(model.replicas) || "\u00a0";
    cells.detail.title = replicaLines(model.replicas);
    const serving = ["ready", "active", "draining"].includes(model.state);
    cells.inflight.textContent = count(model.inflight);
    cells.queue.textContent = serving ? count(model.queue_depth) : "–";
    cells.memory.textContent = bytes(model.memory_bytes);
    cells.loaded.textContent = model.loaded_at ? clock(model.loaded_at) : "–";
    cells.used.textContent = ago(model.last_used);
    for (const [action, button] of Object.entries(row.buttons)) {
      button.disabled = !this.mutations || Boolean(pending) || !ACTIONS[action].has(model.state);
      button.title = this.mutations ? "" : "needs LLMSO_ADMIN_KEY on the gateway";
    }
  }

  async act(name, action) {
    if (!hasAdminKey()) {
      this.onStatus("Enter the admin key first (top of the page).", true);
      document.getElementById("admin-key").focus();
      return;
    }
    this.pending.set(name, PENDING_LABEL[action]);
    const row = this.rows.get(name);
    if (row?.model) this.fill(row, row.model);
    this.onStatus(`${action} ${name}…`, false);
    try {
      const status = await adminPost(`/admin/models/${encodeURIComponent(name)}/${action}`);
      this.onStatus(`${name}: ${status.state}`, false);
    } catch (error) {
      this.onStatus(`${action} ${name} failed: ${describeError(error)}`, true);
    } finally {
      this.pending.delete(name);
      this.onChange();
    }
  }
}

// With several upstream replicas: "2/3 replicas up · 1 ejected"; each one in the tooltip.
function replicaSummary(replicas) {
  if (!replicas || replicas.length < 2) return "";
  const up = replicas.filter((r) => r.up && !r.ejected && !r.draining).length;
  const ejected = replicas.filter((r) => r.ejected).length;
  return `${up}/${replicas.length} replicas up${ejected ? ` · ${ejected} ejected` : ""}`;
}

function replicaLines(replicas) {
  const state = (r) => (r.ejected ? "ejected" : r.draining ? "draining" : r.up ? "up" : "down");
  return (replicas || []).map((r) => `${r.url}: ${state(r)}, ${r.inflight} in flight`).join("\n");
}

function stateDetail(model) {
  if (model.state === "failed") {
    const retry = model.retry_in ? `, retry in ${model.retry_in.toFixed(0)} s` : "";
    return `${model.last_error ?? "failed"}${retry}`;
  }
  const parts = [];
  if (model.upstream_up === 0) parts.push("upstream down");
  if (model.upstream_up === 1) parts.push("upstream up");
  if (model.kv_cache_usage !== null && model.kv_cache_usage !== undefined && model.state !== "unloaded") {
    parts.push(`KV ${(model.kv_cache_usage * 100).toFixed(0)} %`);
  }
  if (model.restarts) parts.push(`${model.restarts} restart(s)`);
  if (model.last_error && model.state !== "failed") parts.push(`last error: ${model.last_error}`);
  return parts.join(" · ");
}
