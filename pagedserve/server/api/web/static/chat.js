// The chat: a conversation with the chosen model over /v1/chat/completions, streamed, with
// Stop and Regenerate, and each answer's TTFT, tokens/s and token count.

import { apiFetch, errorMessage, sseEvents } from "./api.js";

const $ = (id) => document.getElementById(id);
const history = []; // {role, content} of the finished turns
let running = null; // the AbortController of the answer being streamed
let conversation = 0; // counts Clear presses: an answer that outlives its conversation is dropped

export async function loadModels() {
  const response = await apiFetch("/v1/models");
  if (!response.ok) throw new Error(await errorMessage(response));
  const { data } = await response.json();
  const select = $("model");
  select.replaceChildren(...data.map((m) => new Option(m.id, m.id)));
  $("server-status").textContent = `max_model_len ${data[0]?.max_model_len ?? "?"}`;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.append(body);
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// The request body from the settings; throws on a JSON schema that does not parse.
function requestBody(messages) {
  const system = $("system").value.trim();
  const body = {
    model: $("model").value,
    messages: system ? [{ role: "system", content: system }, ...messages] : messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  if ($("json-mode").checked) {
    let schema;
    try {
      schema = JSON.parse($("json-schema").value);
    } catch (e) {
      throw new Error(`the JSON schema does not parse: ${e.message}`);
    }
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  }
  return body;
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = controller !== null;
  $("stop").disabled = controller === null;
  $("regenerate").disabled = controller !== null || history.length === 0;
}

function showStats(div, stats) {
  const line = document.createElement("div");
  line.className = "stats";
  const parts = [];
  if (stats.ttftMs !== null) parts.push(`TTFT ${stats.ttftMs.toFixed(0)} ms`);
  if (stats.tokensPerS !== null) parts.push(`${stats.tokensPerS.toFixed(1)} tok/s`);
  parts.push(`${stats.tokens} tokens`);
  if (stats.ending) parts.push(stats.ending);
  line.textContent = parts.join(" · ");
  Object.assign(div.dataset, { ttftMs: stats.ttftMs ?? "", tokens: stats.tokens,
                               finishReason: stats.ending });
  div.append(line);
}

// Streams one answer to `messages` into a new assistant message; returns its text.
async function streamAnswer(messages) {
  const div = addMessage("assistant", "");
  const text = div.querySelector(".text");
  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  let first = null, last = null, chunks = 0, usage = null, ending = "";
  try {
    const response = await apiFetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody(messages)),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const event of sseEvents(response)) {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) usage = event.usage;
      const choice = event.choices && event.choices[0];
      if (!choice) continue;
      if (choice.delta && choice.delta.content) {
        last = performance.now();
        first ??= last;
        chunks += 1;
        text.textContent += choice.delta.content;
        div.scrollIntoView({ block: "end" });
      }
      if (choice.finish_reason) ending = choice.finish_reason;
    }
  } catch (e) {
    if (e.name === "AbortError") {
      ending = "stopped";
    } else {
      div.classList.add("error");
      text.textContent += (text.textContent ? "\n" : "") + e.message;
      ending = "error";
    }
  } finally {
    setRunning(null);
  }
  const tokens = usage ? usage.completion_tokens : chunks;
  showStats(div, {
    ttftMs: first === null ? null : first - started,
    tokensPerS: first !== null && last > first && tokens > 1
      ? (tokens - 1) / ((last - first) / 1000) : null,
    tokens,
    ending,
  });
  return ending === "error" ? null : text.textContent;
}

async function answer() {
  const asked = conversation;
  const reply = await streamAnswer([...history]);
  if (reply !== null && asked === conversation) history.push({ role: "assistant", content: reply });
  setRunning(null);
}

async function send(event) {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || running) return;
  $("prompt").value = "";
  history.push({ role: "user", content: prompt });
  addMessage("user", prompt);
  await answer();
}

async function regenerate() {
  if (running || history.length === 0) return;
  if (history[history.length - 1].role === "assistant") history.pop();
  const answers = $("messages").querySelectorAll(".message.assistant");
  if (answers.length) answers[answers.length - 1].remove();
  await answer();
}

export function setUpChat() {
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) $("composer").requestSubmit();
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("clear").addEventListener("click", () => {
    if (running) running.abort();
    conversation += 1;
    history.length = 0;
    $("messages").replaceChildren();
    setRunning(null);
  });
  $("json-mode").addEventListener("change", (e) => { $("json-schema").hidden = !e.target.checked; });
}
