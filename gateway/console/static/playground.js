// The playground: one chat completion streamed through the public API, as a client would
// send it, with TTFT and decode tokens/s measured in the page. A reasoning model's thought
// (delta.reasoning_content) goes in a folded box above the answer, whose one-line summary
// is always there, so nothing moves when a thought starts to stream.

import { describeError, errorFrom } from "./api.js";
import { seconds } from "./format.js";
import { sseData } from "./sse.js";

const $ = (id) => document.getElementById(id);

export class Playground {
  constructor() {
    this.form = $("play-form");
    this.output = $("play-output");
    this.thought = $("play-thought");
    this.thoughtText = $("play-thought-text");
    this.error = $("play-error");
    this.send = $("play-send");
    this.stop = $("play-stop");
    this.controller = null;
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.run();
    });
    this.stop.addEventListener("click", () => this.controller?.abort());
  }

  setModels(names) {
    const select = $("play-model");
    const current = select.value;
    const same = [...select.options].map((o) => o.value).join("\n") === names.join("\n");
    if (same) return;
    select.replaceChildren(...names.map((name) => new Option(name, name)));
    if (names.includes(current)) select.value = current;
  }

  body() {
    const messages = [];
    const system = $("play-system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push({ role: "user", content: $("play-user").value });
    const body = {
      model: $("play-model").value,
      messages,
      temperature: Number($("play-temperature").value),
      max_tokens: Number($("play-max-tokens").value),
      stream: true,
      stream_options: { include_usage: true },
    };
    const schemaText = $("play-schema").value.trim();
    if (schemaText) {
      let schema;
      try {
        schema = JSON.parse(schemaText);
      } catch (error) {
        throw new Error(`the JSON schema is not valid JSON: ${error.message}`);
      }
      body.response_format = {
        type: "json_schema",
        json_schema: { name: "playground", schema, strict: true },
      };
    }
    return body;
  }

  showError(message, hint = "") {
    this.error.replaceChildren(document.createTextNode(message));
    if (hint) {
      const extra = document.createElement("span");
      extra.className = "hint";
      extra.textContent = hint;
      this.error.append(extra);
    }
    this.error.hidden = false;
  }

  metrics({ ttft, tps, tokens, total, model }) {
    if (ttft !== undefined) $("play-ttft").textContent = seconds(ttft);
    if (tps !== undefined) $("play-tps").textContent = tps === null ? "–" : tps.toFixed(1);
    if (tokens !== undefined) $("play-tokens").textContent = String(tokens);
    if (total !== undefined) $("play-total").textContent = seconds(total);
    if (model !== undefined) $("play-answered-by").textContent = model;
  }

  async run() {
    this.error.hidden = true;
    let body;
    try {
      body = this.body();
    } catch (error) {
      this.showError(error.message);
      return;
    }
    this.output.textContent = "";
    const text = document.createTextNode("");
    this.output.append(text);
    this.thoughtText.textContent = "";
    const thought = document.createTextNode("");
    this.thoughtText.append(thought);
    this.thought.open = false;
    $("play-thought-size").textContent = "(none)";
    this.metrics({ ttft: null, tps: null, tokens: 0, total: null, model: "–" });
    this.controller = new AbortController();
    this.send.disabled = true;
    this.stop.disabled = false;
    this.output.setAttribute("aria-busy", "true");
    const started = performance.now();
    let first = null;
    let last = null;
    let deltas = 0;
    let usageTokens = null;
    try {
      const headers = { "Content-Type": "application/json" };
      const key = $("play-client-key").value;
      if (key) headers.Authorization = `Bearer ${key}`;
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers,
        body: JSON.stringify(body),
        signal: this.controller.signal,
      });
      if (!response.ok) throw await errorFrom(response);
      for await (const data of sseData(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw Object.assign(new Error(chunk.error.message), { midStream: chunk.error });
        if (chunk.model) this.metrics({ model: chunk.model });
        if (chunk.usage) usageTokens = chunk.usage.completion_tokens;
        const delta = chunk.choices?.[0]?.delta;
        const thinking = delta?.reasoning_content;
        if (thinking) {
          thought.appendData(thinking);
          this.thoughtText.scrollTop = this.thoughtText.scrollHeight;
          $("play-thought-size").textContent = `(${thought.length} characters)`;
        }
        const piece = delta?.content;
        if (thinking || piece) {
          const now = performance.now();
          if (first === null) {
            first = now;
            this.metrics({ ttft: (now - started) / 1000 });
          }
          last = now;
          deltas += 1;
          if (piece) {
            text.appendData(piece);
            this.output.scrollTop = this.output.scrollHeight;
          }
          this.metrics({ tokens: deltas });
        }
      }
      const tokens = usageTokens ?? deltas;
      const decode = first !== null && last !== null ? (last - first) / 1000 : 0;
      this.metrics({
        tokens,
        tps: decode > 0 && tokens > 1 ? (tokens - 1) / decode : null,
        total: (performance.now() - started) / 1000,
      });
    } catch (error) {
      if (error.name === "AbortError") {
        this.showError("Stopped.");
      } else if (error.midStream) {
        this.showError(`The stream failed: ${error.midStream.type}: ${error.message}`);
      } else {
        const hint =
          error.param === "response_format"
            ? "This model's backend cannot honour a JSON schema yet; clear the schema field to get plain text."
            : "";
        this.showError(describeError(error), hint);
      }
      this.metrics({ total: (performance.now() - started) / 1000 });
    } finally {
      this.output.removeAttribute("aria-busy");
      this.send.disabled = false;
      this.stop.disabled = true;
      this.controller = null;
    }
  }
}
