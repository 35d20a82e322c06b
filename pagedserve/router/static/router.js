// The router's page: /router/state once a second, as a table of replicas.

const POLL_MS = 1000;
const percent = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`);

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function usageCell(usage) {
  const td = document.createElement("td");
  if (usage === null || usage === undefined) { td.textContent = "–"; return td; }
  const bar = document.createElement("span");
  bar.className = "bar";
  const fill = document.createElement("i");
  fill.style.width = `${Math.min(100, 100 * usage).toFixed(1)}%`;
  bar.append(fill);
  td.append(bar, ` ${percent(usage)}`);
  return td;
}

function row(replica) {
  const h = replica.hints || {};
  const tr = document.createElement("tr");
  tr.dataset.url = replica.url;
  tr.append(
    cell(replica.url),
    cell(replica.healthy ? "healthy" : "ejected", replica.healthy ? "ok" : "bad"),
    cell(replica.in_flight),
    cell(replica.routed),
    cell(h.num_running ?? "–"),
    cell(h.num_waiting ?? "–"),
    usageCell(h.kv_cache_usage),
    cell(h.step_ms === null || h.step_ms === undefined ? "–" : `${h.step_ms.toFixed(1)} ms`),
    cell(percent(replica.prefix_cache_hit_rate)),
    cell(replica.ejections),
  );
  return tr;
}

function show(state) {
  document.querySelector("#replicas tbody").replaceChildren(...state.replicas.map(row));
  const healthy = state.replicas.filter((r) => r.healthy).length;
  document.getElementById("summary").textContent =
    `policy ${state.policy} · ${healthy}/${state.replicas.length} healthy · ` +
    `${state.in_flight} of ${state.max_in_flight} in flight`;
  const a = state.affinity;
  const placed = a.hit + a.miss;
  document.getElementById("affinity").textContent =
    `${a.hit} to their prefix's replica, ${a.miss} moved elsewhere, ${a.new} new prefixes` +
    (placed ? ` · affinity hit rate ${percent(a.hit / placed)}` : "");
}

async function poll() {
  try {
    const response = await fetch("/router/state");
    if (response.ok) show(await response.json());
  } catch (_) { /* the router is restarting */ }
  setTimeout(poll, POLL_MS);
}

poll();
