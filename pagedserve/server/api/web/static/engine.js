// The engine view: /engine/state a few times a second, drawn as the KV block grid, the
// queue counts and rates, and a sparkline of the last minute.

import { apiFetch } from "./api.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 250;
const HISTORY = 240; // samples: one minute at POLL_MS
const GRID_HEIGHT = 240; // pixels the grid aims to fill
// One colour per block state digit: 0 free, 1 cached (evictable), 2 in use, 3 shared.
const COLOURS = ["#e8ebef", "#9ecae1", "#2b8cbe", "#e6550d"];
const samples = []; // {tps, kv}

function drawGrid(blocks) {
  const canvas = $("grid");
  const cells = blocks.cells;
  const n = cells.length;
  // Square cells, as large as fit: columns chosen so that the rows fill the canvas.
  const w = canvas.clientWidth || canvas.width;
  const cols = Math.max(1, Math.ceil(Math.sqrt((n * w) / GRID_HEIGHT)));
  const size = Math.max(1, Math.floor(w / cols));
  const rows = Math.ceil(n / cols);
  canvas.width = cols * size;
  canvas.height = rows * size;
  const ctx = canvas.getContext("2d");
  const gap = size >= 6 ? 1 : 0;
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = COLOURS[cells.charCodeAt(i) - 48];
    ctx.fillRect((i % cols) * size, Math.floor(i / cols) * size, size - gap, size - gap);
  }
  canvas.dataset.cells = cells;
}

function drawSparkline() {
  const canvas = $("sparkline");
  const ctx = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  ctx.clearRect(0, 0, w, h);
  const maxTps = Math.max(1, ...samples.map((s) => s.tps));
  const line = (value, colour) => {
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    // The newest sample at the right edge; a minute spans the width.
    const offset = HISTORY - samples.length;
    samples.forEach((s, i) => {
      const x = ((offset + i) / (HISTORY - 1)) * w;
      const y = h - 2 - value(s) * (h - 4);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  };
  line((s) => s.kv, "#2b8cbe");
  line((s) => s.tps / maxTps, "#e6550d");
  $("spark-max").textContent = `top ${maxTps.toFixed(0)} tok/s`;
}

const percent = (x) => (x === null ? "–" : `${(100 * x).toFixed(1)} %`);

function show(state) {
  const b = state.blocks;
  drawGrid(b);
  for (const name of ["free", "cached", "used", "shared"]) $(`count-${name}`).textContent = b[name];
  $("block-summary").textContent = `${b.num_blocks} blocks × ${b.block_size} tokens` +
    (b.blocks_per_cell > 1 ? `, ${b.blocks_per_cell} blocks a cell` : "");
  $("stat-running").textContent = state.num_running;
  $("stat-waiting").textContent = state.num_waiting;
  $("stat-swapped").textContent = state.num_swapped;
  $("stat-preemptions").textContent = state.num_preemptions;
  $("stat-step").textContent = state.step_ms === null ? "–" : `${state.step_ms.toFixed(1)} ms`;
  $("stat-tps").textContent = state.generation_tokens_per_s.toFixed(1);
  $("stat-hit-rate").textContent = percent(state.prefix_cache_hit_rate);
  samples.push({ tps: state.generation_tokens_per_s, kv: state.kv_cache_usage });
  if (samples.length > HISTORY) samples.shift();
  drawSparkline();
}

async function poll() {
  try {
    const response = await apiFetch("/engine/state");
    if (response.ok) {
      show(await response.json());
      $("engine-pane").classList.remove("stale");
    } else {
      $("engine-pane").classList.add("stale");
    }
  } catch (_) {
    $("engine-pane").classList.add("stale"); // the server is gone or restarting
  }
  setTimeout(poll, POLL_MS);
}

export function startEngineView() {
  poll();
}
