// dcpserve's web page: a chat through /v1/chat/completions (streamed) and a live view of
// /v1/engine/status. Plain DOM, no framework; text from the server is only ever set as
// textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "dcpserve.apiKey";
const history = []; // the conversation sent with each request
let controller = null; // AbortController of the request in flight

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return "HTTP " + resp.status;
}

// ---- models ----

async function loadModels() {
  const select = $("model");
  try {
    const resp = await fetch("/v1/models", { headers: headers(false) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const list = await resp.json();
    const current = select.value;
    select.textContent = "";
    for (const m of list.data) select.append(el("option", "", m.id));
    if ([...select.options].some((o) => o.value === current)) select.value = current;
    $("server-error").textContent = "";
  } catch (e) {
    $("server-error").textContent = "models: " + e.message;
  }
}

// ---- chat ----

function addMessage(role, text) {
  const box = el("div", "msg " + role);
  box.append(el("div", "role", role));
  const content = el("div", "content", text);
  box.append(content);
  $("messages").append(box);
  box.scrollIntoView({ block: "end" });
  return box;
}

function numberField(id, body, name, integer) {
  const raw = $(id).value.trim();
  if (raw === "") return;
  const v = integer ? parseInt(raw, 10) : parseFloat(raw);
  if (Number.isNaN(v)) throw new Error(name + " is not a number");
  body[name] = v;
}

function jsonField(id, name) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  try {
    return JSON.parse(raw);
  } catch (e) {
    throw new Error(name + " is not valid JSON: " + e.message);
  }
}

function requestBody() {
  const body = { model: $("model").value, stream: true, messages: [] };
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...history);
  numberField("temperature", body, "temperature", false);
  numberField("top-p", body, "top_p", false);
  numberField("top-k", body, "top_k", true);
  numberField("max-tokens", body, "max_tokens", true);
  numberField("seed", body, "seed", true);
  if ($("ignore-eos").checked) body.ignore_eos = true;
  const format = jsonField("response-format", "response_format");
  if (format !== undefined) {
    // A bare schema is wrapped; an object with `type` is sent as written.
    body.response_format = typeof format === "object" && format !== null && "type" in format &&
      ["text", "json_object", "json_schema"].includes(format.type)
      ? format
      : { type: "json_schema", json_schema: { name: "schema", schema: format } };
  }
  const tools = jsonField("tools", "tools");
  if (tools !== undefined) body.tools = tools;
  const choice = $("tool-choice").value;
  if (choice) body.tool_choice = choice;
  return body;
}

// Reads an SSE body and calls onData with each `data:` payload.
async function readSse(resp, onData) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  }
}

function renderToolCalls(box, calls) {
  let pre = box.querySelector(".tool-calls");
  if (!pre) {
    pre = el("pre", "tool-calls");
    box.append(pre);
  }
  pre.textContent = calls
    .filter(Boolean)
    .map((c) => "tool call " + (c.id || "") + ": " + c.name + "(" + c.arguments + ")")
    .join("\n");
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || controller) return;
  let body;
  try {
    history.push({ role: "user", content: text });
    body = requestBody();
  } catch (e) {
    history.pop();
    addMessage("error", e.message);
    return;
  }
  addMessage("user", text);
  $("prompt").value = "";
  const box = addMessage("assistant", "");
  box.classList.add("streaming");
  const content = box.querySelector(".content");
  let reasoning = null;
  const calls = [];
  let finish = null;
  let answer = "";
  let failed = false;
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readSse(resp, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "stream error");
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content) {
          if (!reasoning) {
            reasoning = el("div", "reasoning");
            box.insertBefore(reasoning, content);
          }
          reasoning.textContent += d.reasoning_content;
        }
        if (d.content) {
          answer += d.content;
          content.textContent = answer;
        }
        for (const tc of d.tool_calls || []) {
          const c = calls[tc.index] || (calls[tc.index] = { id: "", name: "", arguments: "" });
          if (tc.id) c.id = tc.id;
          if (tc.function && tc.function.name) c.name += tc.function.name;
          if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
          renderToolCalls(box, calls);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    box.append(el("div", "finish", "finish_reason: " + (finish || "?")));
  } catch (e) {
    if (e.name === "AbortError") {
      box.append(el("div", "finish", "stopped"));
    } else {
      box.append(el("div", "error", e.message));
      failed = true;
    }
  } finally {
    const msg = { role: "assistant", content: answer };
    const made = calls.filter(Boolean);
    if (made.length) {
      msg.tool_calls = made.map((c) => ({
        id: c.id, type: "function", function: { name: c.name, arguments: c.arguments },
      }));
    }
    // A refused or failed request leaves the conversation as it was (its message stays
    // on screen, with the error); a stopped one keeps what was streamed.
    if (failed) history.pop();
    else history.push(msg);
    box.classList.remove("streaming");
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function stop() {
  if (controller) controller.abort();
}

function clearChat() {
  stop();
  history.length = 0;
  $("messages").textContent = "";
}

// ---- engine view ----

function stat(label, value, cls) {
  const d = el("div", "stat " + cls);
  d.append(el("span", "label", label));
  d.append(el("span", "value", String(value)));
  return d;
}

function bar(parts, total) {
  // parts: [{n, cls, title}]; widths are shares of `total`.
  const b = el("div", "bar");
  for (const p of parts) {
    const s = el("span", "seg " + p.cls, p.label === undefined ? "" : p.label);
    s.style.width = (total > 0 ? (100 * p.n) / total : 0) + "%";
    s.title = p.title;
    b.append(s);
  }
  return b;
}

function renderModel(m) {
  const sec = el("section", "model");
  sec.dataset.model = m.model;
  const title = el("h3", "", m.model);
  if (m.layout) {
    const l = m.layout;
    const pcp = l.prefill_context_parallel_size > 1 ? " pcp=" + l.prefill_context_parallel_size : "";
    title.append(el("small", "", "  tp=" + l.tensor_parallel_size + pcp + " dcp=" + l.decode_context_parallel_size +
      " interleave=" + l.cp_kv_cache_interleave_size + " block=" + l.block_size));
  }
  sec.append(title);
  if (!m.available) sec.append(el("div", "error", m.error || "unavailable"));
  const stats = el("div", "stats");
  stats.append(
    stat("running", m.requests.running, "stat-running"),
    stat("waiting", m.requests.waiting, "stat-waiting"),
    stat("admitted", m.requests.admitted, "stat-admitted"),
    stat("tokens/s", m.tokens_per_second == null ? "–" : m.tokens_per_second.toFixed(1), "stat-tps"),
    stat("generated", m.generated_tokens, "stat-generated"),
    stat("preemptions", m.preemptions, "stat-preemptions"),
    stat("KV blocks used", m.kv.blocks_used + " / " + m.kv.blocks_total, "stat-blocks"),
  );
  sec.append(stats);

  const ranks = el("table", "ranks");
  const head = el("tr");
  for (const h of ["rank", "dcp rank", "blocks used", "blocks free", "tokens stored", ""]) head.append(el("th", "", h));
  ranks.append(head);
  for (const r of m.ranks) {
    const row = el("tr", "rank");
    row.dataset.rank = r.rank;
    row.append(el("td", "", r.rank), el("td", "", r.dcp_rank), el("td", "blocks-used", r.blocks_used),
      el("td", "blocks-free", r.blocks_free), el("td", "tokens-stored", r.tokens_stored));
    const cell = el("td", "bar-cell");
    const filled = Math.min(r.tokens_stored, r.tokens_capacity);
    const reserved = Math.max(0, r.blocks_used * (m.layout ? m.layout.block_size : 0) - filled);
    cell.append(bar([
      { n: filled, cls: "dcp" + (r.dcp_rank % 8), title: r.tokens_stored + " tokens stored" },
      { n: reserved, cls: "reserved", title: "room left in the rank's used blocks" },
    ], r.tokens_capacity));
    row.append(cell);
    ranks.append(row);
  }
  sec.append(ranks);

  const seqs = el("div", "sequences");
  seqs.append(el("h4", "", "Sequences: KV per DCP rank"));
  if (m.sequences.length === 0) seqs.append(el("div", "empty", "no sequence"));
  for (const s of m.sequences) {
    const row = el("div", "seq " + s.state);
    row.dataset.id = s.id;
    row.dataset.kvTokens = s.kv_tokens;
    row.append(el("span", "seq-id", "#" + s.id + " " + s.state));
    row.append(el("span", "seq-tokens", s.kv_tokens + " tok, " + s.kv_blocks + " blocks"));
    row.append(bar(s.dcp_tokens.map((n, i) => ({
      n, cls: "dcp" + (i % 8), label: String(n), title: "DCP rank " + i + ": " + n + " tokens",
    })), s.kv_tokens));
    seqs.append(row);
  }
  sec.append(seqs);
  return sec;
}

let refreshing = false; // a slow answer is not asked for again before it comes

async function refreshEngine() {
  if (refreshing) return;
  refreshing = true;
  const box = $("engine");
  try {
    const resp = await fetch("/v1/engine/status", { headers: headers(false) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const status = await resp.json();
    box.replaceChildren(...status.models.map(renderModel));
    $("engine-updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    box.replaceChildren(el("div", "error", "engine status: " + e.message));
  } finally {
    refreshing = false;
  }
}

// ---- wiring ----

function init() {
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORE, key.value);
    loadModels();
    refreshEngine();
  });
  $("chat-form").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.ctrlKey) $("send").click();
  });
  $("stop").addEventListener("click", stop);
  $("clear").addEventListener("click", clearChat);
  loadModels();
  refreshEngine();
  setInterval(refreshEngine, 500);
}

document.addEventListener("DOMContentLoaded", init);
