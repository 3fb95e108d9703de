// The console's entry point: wires the views and polls the JSON views every 1.5 s.

import { ApiError, adminGet, describeError, setAdminKey } from "./api.js";
import { BatchesView } from "./batches.js";
import { KeysView } from "./keys.js";
import { LiveView } from "./live.js";
import { ModelsView } from "./models.js";
import { Playground } from "./playground.js";
import { RequestsView } from "./requests.js";

const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);

function setStatus(message, bad = false) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("bad", bad);
}

const models = new ModelsView($("models"), $("mutations-note"), {
  onStatus: setStatus,
  onChange: () => tick(),
});
const live = new LiveView($("live"));
const requests = new RequestsView($("requests"), $("timeline"));
const batches = new BatchesView($("batches"));
const keys = new KeysView($("keys"));
const playground = new Playground();

let timer = null;
let running = false;
let needKey = false;
let filterGeneration = 0; // bumped when the filter changes: older answers are dropped

function requestsPath() {
  const query = new URLSearchParams({ limit: "100" });
  const model = $("filter-model").value;
  const status = $("filter-status").value;
  if (model) query.set("model", model);
  if (status) query.set("status", status);
  return `/admin/requests?${query}`;
}

function setFilterModels(names) {
  const select = $("filter-model");
  const have = [...select.options].slice(1).map((o) => o.value);
  if (have.join("\n") === names.join("\n")) return;
  const current = select.value;
  select.replaceChildren(new Option("all", ""), ...names.map((n) => new Option(n, n)));
  select.value = names.includes(current) ? current : "";
}

async function tick() {
  if (running) return;
  running = true;
  const generation = filterGeneration;
  try {
    const [modelList, stats, recent, batchList, usage] = await Promise.all([
      adminGet("/admin/models"),
      adminGet("/admin/stats"),
      adminGet(requestsPath()),
      adminGet("/admin/batches?limit=20"),
      adminGet("/admin/usage"),
    ]);
    const names = modelList.models.map((m) => m.name);
    models.render(modelList);
    live.render(stats);
    if (generation === filterGeneration) requests.render(recent.requests);
    batches.render(batchList.batches);
    keys.render(usage);
    playground.setModels(names);
    setFilterModels(names);
    needKey = false;
    const fleet = stats.workers > 1 ? `, ${stats.workers} workers` : "";
    // How late the event loop runs (the worst worker's): past tens of ms it is saturated.
    const lag = stats.loop_lag_s == null ? "" : `, event loop ${Math.round(stats.loop_lag_s * 1000)} ms late`;
    setStatus(`Updated ${new Date().toLocaleTimeString([], { hour12: false })}${fleet}${lag}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      needKey = true;
      setStatus("This gateway needs its admin key for these views: enter it above.", true);
    } else {
      setStatus(`Cannot reach the gateway: ${describeError(error)}`, true);
    }
  } finally {
    running = false;
  }
}

function schedule() {
  clearInterval(timer);
  timer = setInterval(() => {
    if (!document.hidden && !needKey) tick();
  }, POLL_MS);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("admin-key");
  setAdminKey(input.value.trim());
  input.value = "";
  input.placeholder = "key set (in memory)";
  needKey = false;
  tick();
});

$("forget-key").addEventListener("click", () => {
  setAdminKey(null);
  $("admin-key").placeholder = "LLMSO_ADMIN_KEY";
  setStatus("Admin key forgotten.");
  tick();
});

for (const id of ["filter-model", "filter-status"]) {
  $(id).addEventListener("change", () => {
    filterGeneration += 1;
    requests.reset();
    running = false; // the answer in flight is dropped by its generation
    tick();
  });
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) tick();
});

tick();
schedule();
