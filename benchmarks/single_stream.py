"""One user on a CPU: pagedserve against llama.cpp's ``llama-server`` on the same GGUF files,
each with its defaults, driven by the same client, with the machine's read bandwidth, each
server's memory and its start-up time beside the throughput.

1. A STREAM-like read probe: the best of several sums over a 1 GiB float32 array on
   ``--threads`` threads (2 by default), in GB/s.
2. For each file (random Llama-3.2-1B-shaped Q4_K_M and Q8_0 made by llama.cpp's converter
   and ``llama-quantize``: ``gguf_presets.make_files``) and each server (``vs_peers_gguf.py`` starts
   them: pagedserve with its defaults, pagedserve with the block-quant kernel's AVX2 path
   forced, ``PAGEDSERVE_BLOCK_QUANT=avx2``, or its AVX-VNNI path, ``=avxvnni`` (what a CPU
   without AVX-512 runs), and llama-server with its defaults, ``-np`` = the
   concurrency): 128 prompt tokens and 128 output tokens (``--ignore-eos``) at 1, 8 and 32
   streams through ``vllm bench serve`` when installed, else ``pagedserve bench``: output
   tok/s, mean TTFT and TPOT.
3. At one stream, the roofline share: the bytes a decode step must read (every weight of the
   file once, the tied embedding as the LM head, and K and V of the mean context in float16,
   both servers' default) / TPOT / the probe's bandwidth.
4. Memory and start-up (medians over the rounds, and the run's first start): seconds from
   launch to the first 200 on ``/health``; the resident set when ready, its highest while
   one stream decodes, and the process's peak (VmHWM) after the one-stream run, against the
   goal of file + KV cache + 400 MiB.

    python -m benchmarks.single_stream --llama-server PATH [--quick] [--rounds 1]
        [--files Q4_K_M,Q8_0] [--servers pagedserve,pagedserve_avxvnni,pagedserve_avx2,llama_cpp]
        [--concurrency 1,8,32] [--gguf FILE ...]

``--quick``: the Q4_K_M file, 32 output tokens, 1 and 8 streams, one prompt per stream.
With ``--rounds N`` every server runs N times in turn and each cell is its median round.
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.harness import free_port, stop, wait_ready
from benchmarks.vs_peers import Workload, find_tool, load_average
from benchmarks.vs_peers_gguf import (
    LLAMA_CLIENT,
    PAGEDSERVE_MODES,
    WARM_UP,
    BenchClient,
    export_tokenizer,
    llama_default_server,
    pagedserve_gguf_server,
)

SERVERS = ("pagedserve", "pagedserve_avxvnni", "pagedserve_avx2", "llama_cpp")
FORCED_PATHS = {"pagedserve_avx2": "avx2", "pagedserve_avxvnni": "avxvnni"}
# The block-quant kernel's path, forced (pagedserve.kernels.cpu_block_quant).
BLOCK_QUANT_ENV = "PAGEDSERVE_BLOCK_QUANT"
MiB = 1 << 20
RSS_GOAL_SLACK = 400 * MiB
KV_LINE = re.compile(r"KV cache: .* ([\d,]+) bytes")
# Shared with gguf_presets.py, which makes the same files.
FILES_DIR = Path.home() / ".cache" / "pagedserve-gguf"


def read_bandwidth_gbs(threads: int = 2, mib: int = 1024, repeat: int = 7) -> float:
    """The best read rate of ``x.sum()`` over ``mib`` MiB of float32 on ``threads`` threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(mib * MiB // 4, dtype=torch.float32)
        x.sum()
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return mib * MiB / best / 1e9


def bytes_per_token(model: Path, context: int, kv_bytes: int = 2) -> int:
    """What one decode step must read: every tensor of the file once (an embedding tied to the
    output is read whole as the LM head; an untied one only a row) and K and V of ``context``
    positions at ``kv_bytes`` an element."""
    from pagedserve.common.gguf_file import open_gguf
    from pagedserve.server.models.gguf_config import gguf_model_config

    reader = open_gguf(model)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    weights = sum(int(t.n_bytes) for t in reader.tensors
                  if tied or t.name != "token_embd.weight")
    config = gguf_model_config(reader)
    kv = (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
          * kv_bytes * context)
    return weights + kv


@dataclass
class MemoryWatch:
    """Samples a process's resident set (/proc/PID/status) every ``interval_s`` in a thread."""

    pid: int
    interval_s: float = 0.1
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def status(self, key: str) -> int:
        """VmRSS, VmHWM, ... in bytes (0 once the process is gone)."""
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
        return int(match.group(1)) * 1024 if match else 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.status("VmRSS"))

    def peak_since(self, start: int) -> int:
        return max(self.samples[start:], default=self.status("VmRSS"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def servers_for(name: str, model: Path, port: int, w: Workload, work: Path, threads: int,
                llama: Path | None):
    if name == "llama_cpp":
        return llama_default_server(llama, model, port, w, work, threads)
    server = pagedserve_gguf_server(model, port, work, PAGEDSERVE_MODES["pagedserve_gguf"],
                                    threads)
    if name in FORCED_PATHS:
        path = FORCED_PATHS[name]
        server = replace(server, name=f"pagedserve {path}", env={BLOCK_QUANT_ENV: path},
                         log=work / f"pagedserve-{path}.log")
    return server


def serve_and_measure(name: str, model: Path, workloads: list[Workload], work: Path,
                      threads: int, llama: Path | None, bench: BenchClient,
                      timeout: float) -> dict:
    """Runs ``workloads`` against one server (llama.cpp: one per workload, its slots are
    fixed at start); start-up and memory come from the first."""
    results: dict = {}
    per_workload = name == "llama_cpp"
    groups = [[w] for w in workloads] if per_workload else [workloads]
    extra = LLAMA_CLIENT if per_workload else ()
    for group in groups:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = servers_for(name, model, port, group[0], work, threads, llama)
        started = time.monotonic()
        process = server.start()
        watch = MemoryWatch(process.pid)
        try:
            wait_ready(base, process, timeout, poll_s=0.05)
            memory = {"startup_s": time.monotonic() - started,
                      "rss_ready": watch.status("VmRSS")}
            bench(base, model, WARM_UP, work / f"{name}-warm-up.json", extra)
            for w in group:
                first = len(watch.samples)
                results[w.name] = bench(base, model, w, work / f"{name}-{w.name}.json", extra)
                if w.concurrency == 1 and "memory" not in results:
                    memory.update(rss_decoding=watch.peak_since(first),
                                  rss_peak=watch.status("VmHWM"),
                                  kv_bytes=_kv_bytes(server.log))
                    results["memory"] = memory
                _show(name, w, results[w.name])
        finally:
            watch.close()
            stop(process)
    return results


def _kv_bytes(log: Path) -> int | None:
    """pagedserve's KV cache from its start-up log (None for llama.cpp, whose log at its
    default verbosity does not say)."""
    matches = KV_LINE.findall(log.read_text(errors="replace")) if log.exists() else []
    return int(matches[-1].replace(",", "")) if matches else None


def _show(name: str, w: Workload, r: dict) -> None:
    print(f"  {name:16s} {w.name:4s} {r['output_tok_s']:8.1f} tok/s  TTFT "
          f"{r['mean_ttft_ms'] or 0:8.1f} ms  TPOT {r['mean_tpot_ms'] or 0:7.1f} ms  "
          f"completed {r['completed']}/{w.num_prompts}", flush=True)


def _median(runs: list[dict], workload: str, key: str) -> float:
    return statistics.median(float(r[workload][key] or 0.0) for r in runs)


def _median_memory(rounds: list[dict]) -> dict:
    """Each measure's median over the rounds (each round starts the server afresh), as every
    other cell; ``startup_first_s`` keeps the run's first start, after which the machine had
    been idle (on a VM whose host hands back idle memory, it faults everything in anew)."""
    if not rounds:
        return {}
    memory = {key: (statistics.median(r[key] for r in rounds)
                    if all(isinstance(r.get(key), (int, float)) for r in rounds)
                    else rounds[0].get(key)) for key in rounds[0]}
    memory["startup_first_s"] = rounds[0].get("startup_s")
    return memory


def summarize(model: Path, runs: dict[str, list[dict]], workloads: list[Workload],
              bandwidth: float, context: int) -> dict:
    """Medians over rounds, ratios to llama.cpp, the roofline share at one stream and the
    memory table."""
    floor_bytes = bytes_per_token(model, context)
    out: dict = {"file_mib": model.stat().st_size / MiB, "bytes_per_token": floor_bytes,
                 "servers": {}}
    for name, server_runs in runs.items():
        row: dict = {}
        for w in workloads:
            row[w.name] = {k: _median(server_runs, w.name, k)
                           for k in ("output_tok_s", "mean_ttft_ms", "mean_tpot_ms")}
        one = next((w.name for w in workloads if w.concurrency == 1), None)
        if one is not None and row[one]["mean_tpot_ms"]:
            row["roofline_share"] = (floor_bytes / (row[one]["mean_tpot_ms"] / 1e3)
                                     / (bandwidth * 1e9))
        memory = _median_memory([r["memory"] for r in server_runs if r.get("memory")])
        if memory.get("kv_bytes"):
            memory["rss_goal"] = model.stat().st_size + memory["kv_bytes"] + RSS_GOAL_SLACK
        row["memory"] = memory
        out["servers"][name] = row
    if "llama_cpp" in out["servers"]:
        peer = out["servers"]["llama_cpp"]
        for name, row in out["servers"].items():
            if name != "llama_cpp":
                row["vs_llama_cpp"] = {
                    w.name: row[w.name]["output_tok_s"] / peer[w.name]["output_tok_s"]
                    for w in workloads if peer[w.name]["output_tok_s"]}
                if peer["memory"].get("startup_s"):
                    row["startup_vs_llama_cpp"] = (row["memory"]["startup_s"]
                                                   / peer["memory"]["startup_s"])
    return out


def print_tables(model: Path, summary: dict, workloads: list[Workload]) -> None:
    print(f"\n{model.name} ({summary['file_mib']:.1f} MiB; a decode step reads "
          f"{summary['bytes_per_token'] / MiB:.1f} MiB)")
    for name, row in summary["servers"].items():
        cells = "  ".join(f"{w.name} {row[w.name]['output_tok_s']:7.1f} tok/s "
                          f"(TTFT {row[w.name]['mean_ttft_ms']:.0f}, TPOT "
                          f"{row[w.name]['mean_tpot_ms']:.1f} ms)" for w in workloads)
        share = row.get("roofline_share")
        ratios = row.get("vs_llama_cpp", {})
        print(f"  {name:16s} {cells}"
              + (f"  roofline {share:.2f}" if share else "")
              + ("  vs llama.cpp " + " ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
                 if ratios else ""))
    for name, row in summary["servers"].items():
        m = row["memory"]
        if not m:
            continue
        goal = f", goal {m['rss_goal'] / MiB:.0f}" if m.get("rss_goal") else ""
        first = (f" (the run's first {m['startup_first_s']:.1f} s)"
                 if m.get("startup_first_s") is not None else "")
        print(f"  {name:16s} start-up {m['startup_s']:.1f} s{first}; RSS MiB ready "
              f"{m['rss_ready'] / MiB:.0f}, decoding {m['rss_decoding'] / MiB:.0f}, peak "
              f"{m['rss_peak'] / MiB:.0f}{goal}")


def model_files(args: argparse.Namespace, llama: Path | None) -> list[Path]:
    """``--gguf``'s files, else the 1B-shaped presets made by the llama.cpp tree that built
    ``llama`` (``src/build/bin/llama-server``), kept in ``--files-dir``."""
    if args.gguf:
        return [Path(p).resolve() for p in args.gguf]
    if llama is None:
        raise SystemExit("the files are made with llama.cpp's tools: pass --llama-server or "
                         "--gguf FILE")
    from benchmarks.gguf_presets import make_files
    from benchmarks.llama_cpp_tools import LlamaCpp

    presets = args.files.split(",")
    tools = LlamaCpp.find(llama.resolve().parents[3])
    files = make_files(tools, Path(args.files_dir), "1b", presets)
    return [files[preset] for preset in presets]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", help="llama.cpp's llama-server "
                                               "(../shared/peers/install-llama-cpp.sh)")
    parser.add_argument("--vllm", help="vLLM's executable, whose `vllm bench serve` is then "
                                       "the client (../shared/peers/install-vllm-cpu.sh)")
    parser.add_argument("--gguf", nargs="*", help="files to serve instead of the 1B files")
    parser.add_argument("--files", default="Q4_K_M,Q8_0",
                        help="llama-quantize presets of the 1B-shaped model")
    parser.add_argument("--files-dir", default=str(FILES_DIR),
                        help="where the files are made once and reused")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompts-per-stream", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="compute threads of every server and of the read probe")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "single_stream"))
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.concurrency, args.output_len = "Q4_K_M", "1,8", 32
        args.prompts_per_stream = 1
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    llama, why = find_tool(args.llama_server, "llama-server")
    servers = [s for s in args.servers.split(",") if s in SERVERS]
    if llama is None and "llama_cpp" in servers:
        print(f"skipping llama_cpp: {why}", flush=True)
        servers.remove("llama_cpp")
    files = model_files(args, llama)
    workloads = [Workload(f"c{c}", args.input_len, args.output_len,
                          max(2, c * args.prompts_per_stream), c)
                 for c in map(int, args.concurrency.split(","))]
    vllm, vllm_why = find_tool(args.vllm, "vllm")
    bandwidth = read_bandwidth_gbs(args.threads)
    print(f"{os.cpu_count()} cores, {args.threads} threads, load average {load_average()}, "
          f"read bandwidth {bandwidth:.1f} GB/s, client "
          f"{'vllm bench serve' if vllm else f'pagedserve bench ({vllm_why})'}", flush=True)
    result: dict = {"read_bandwidth_gbs": bandwidth, "threads": args.threads, "files": {}}
    context = args.input_len + args.output_len // 2
    for model in files:
        client = BenchClient(vllm, export_tokenizer(model, work)) if vllm else BenchClient()
        runs: dict[str, list[dict]] = {s: [] for s in servers}
        for number in range(args.rounds):
            print(f"{model.name}, round {number + 1} of {args.rounds}", flush=True)
            for name in servers:
                runs[name].append(serve_and_measure(name, model, workloads, work, args.threads,
                                                    llama, client, args.startup_timeout))
        summary = summarize(model, runs, workloads, bandwidth, context)
        print_tables(model, summary, workloads)
        result["files"][model.name] = summary
    result["load_average"] = load_average()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
