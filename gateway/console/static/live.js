// Live load cards, one per model, from /admin/stats. Requests/s, tokens/s and errors come
// as per-second series from the server; percentiles and gauges are kept here as history.
// "overhead" is the gateway's own time per request over the last minute (the mean of
// llmso_overhead_seconds: time not spent waiting on the upstream), over every worker.

import { History, Sparkline } from "./charts.js";
import { el, percent, rate, seconds } from "./format.js";

function chart(caption, label, lines, max = null) {
  const figure = el("figure", "", "chart");
  const cap = el("figcaption");
  const value = el("span", "–", "value");
  cap.append(el("span", caption), value);
  const line = new Sparkline(label, lines, max);
  figure.append(cap, line.svg);
  return { figure, value, line };
}

function fact(list, name) {
  const wrap = el("div");
  const value = el("dd", "–");
  wrap.append(el("dt", name), value);
  list.append(wrap);
  return value;
}

class ModelCard {
  constructor(name) {
    this.root = el("article", "", "card");
    this.root.dataset.model = name;
    const title = el("h3");
    this.state = el("span", "", "badge");
    title.append(el("span", name), this.state);
    const charts = el("div", "", "charts");
    this.rps = chart("requests/s", `${name}: requests per second, last minute`, 1);
    this.tps = chart("output tok/s", `${name}: output tokens per second, last minute`, 1);
    this.ttft = chart("TTFT p50 / p95", `${name}: time to first token, p50 and p95`, 2);
    this.kv = chart("KV cache / batch", `${name}: KV-cache use and mean batch size`, 2, 1);
    for (const c of [this.rps, this.tps, this.ttft, this.kv]) charts.append(c.figure);
    const facts = el("dl", "", "facts");
    this.facts = {
      itl50: fact(facts, "ITL p50"),
      itl95: fact(facts, "ITL p95"),
      e2e95: fact(facts, "E2E p95"),
      overhead: fact(facts, "overhead"),
      inflight: fact(facts, "in flight"),
      errors4: fact(facts, "4xx"),
      errors5: fact(facts, "5xx"),
    };
    this.root.append(title, charts, facts);
    this.history = { ttft50: new History(), ttft95: new History(), kv: new History(), batch: new History() };
  }

  update(stats) {
    const series = stats.series;
    this.state.textContent = stats.state;
    this.state.className = `badge ${stats.state}`;
    this.rps.line.draw(series.requests);
    this.rps.value.textContent = rate(stats.requests_per_s, "/s");
    const tokens = series.output_tokens;
    this.tps.line.draw(tokens);
    this.tps.value.textContent = rate(stats.output_tokens_per_s, "/s");
    const h = this.history;
    this.ttft.line.draw(h.ttft50.push(stats.ttft_p50_s), h.ttft95.push(stats.ttft_p95_s));
    this.ttft.value.textContent = `${seconds(stats.ttft_p50_s)} / ${seconds(stats.ttft_p95_s)}`;
    const kv = stats.kv_cache_usage ?? null;
    const batch = stats.batch_size_mean ?? null;
    // Both on one chart: KV as a fraction of its max, batch scaled to its own max.
    const batchPoints = h.batch.push(batch);
    const batchMax = Math.max(1, ...batchPoints.filter((v) => v !== null));
    this.kv.line.draw(h.kv.push(kv), batchPoints.map((v) => (v === null ? null : v / batchMax)));
    this.kv.value.textContent = `${percent(kv)} / ${batch === null ? "–" : batch.toFixed(1)}`;
    this.facts.itl50.textContent = seconds(stats.itl_p50_s);
    this.facts.itl95.textContent = seconds(stats.itl_p95_s);
    this.facts.e2e95.textContent = seconds(stats.e2e_p95_s);
    this.facts.overhead.textContent = seconds(stats.overhead_mean_s);
    this.facts.inflight.textContent = String(stats.inflight);
    this.facts.errors4.textContent = String(stats.errors_4xx);
    this.facts.errors5.textContent = String(stats.errors_5xx);
  }
}

export class LiveView {
  constructor(container) {
    this.container = container;
    this.cards = new Map();
  }

  render(payload) {
    const names = Object.keys(payload.models);
    for (const name of names) {
      let card = this.cards.get(name);
      if (!card) {
        card = new ModelCard(name);
        this.cards.set(name, card);
        this.container.append(card.root);
      }
      card.update(payload.models[name]);
    }
    for (const [name, card] of this.cards) {
      if (!names.includes(name)) {
        card.root.remove();
        this.cards.delete(name);
      }
    }
  }
}
