// Requests to the server with the API key, when it asks for one: a 401 opens the key dialog
// once, the key is kept in sessionStorage (this tab only) and the request is sent again.

const KEY_ITEM = "pagedserve.apiKey";
let asking = null; // the open dialog's promise, shared by every request that got a 401

function headers(extra) {
  const key = sessionStorage.getItem(KEY_ITEM);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

function askForKey(refused) {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").hidden = !refused;
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      sessionStorage.setItem(KEY_ITEM, input.value.trim());
      input.value = "";
      asking = null;
      resolve();
    }, { once: true });
  });
  dialog.showModal();
  input.focus();
  return asking;
}

// fetch() with the key; asks for it (again) while the server answers 401.
export async function apiFetch(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headers(options.headers) });
    if (response.status !== 401) return response;
    await askForKey(sessionStorage.getItem(KEY_ITEM) !== null);
  }
}

// The message of an OpenAI-shaped error body, or the status line.
export async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

// The events of a server-sent-event stream, as parsed JSON objects; stops at [DONE].
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}
