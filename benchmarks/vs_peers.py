"""Served throughput of pagedserve against vLLM's CPU engine and llama.cpp's server, one server
at a time on the same machine, model, precision (float32), KV budget and client.

The model is the random-weight Llama of ``peer_model.py`` (or ``--model DIR``); llama.cpp serves
the same weights converted to GGUF float32. Every workload is driven by ``vllm bench serve``
(random dataset, ``--ignore-eos``, request rate inf, a max concurrency) from vLLM's own venv, and
``pagedserve bench`` gives a second opinion on the first workload. Throughput counts completed
requests only: a server that drops requests does not win by dropping them.

KV budget: every server gets ``--kv-gib`` of KV cache. pagedserve and vLLM share theirs between
requests; llama.cpp splits its context evenly between slots, so each workload restarts it with
as many slots as the budget holds whole requests (at most the concurrency). One workload
exceeds the budget at its concurrency (128 x 640 tokens > 65,536 in 1 GiB), so the KV cache is
the limit there.

    python -m benchmarks.vs_peers --vllm PATH --llama-server PATH [--quick] [--rounds 3]

With ``--rounds N`` every server runs N times in turn and each cell is its median round
(``vs_peers_report.py``).

Its real-model mode, ``vs_peers_gguf.py``, serves one GGUF file (SmolLM2-135M-Instruct Q4_1 by
default) with its weights as stored against llama.cpp's server with its defaults on that file.

A peer that is not installed is skipped with the reason. Last line: one JSON object with
``ratio_vs_vllm_cpu`` and ``ratio_vs_llama_cpp`` per workload and the minimum of each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    PAGEDSERVE,
    free_port,
    pagedserve_command,
    run_client,
    start,
    stop,
    wait_ready,
)
from benchmarks.peer_model import build_peer_model
from benchmarks.vs_peers_report import SERVERS, report

BYTES_PER_GIB = 1 << 30
# Every server answers this once it serves (llama.cpp and vLLM as pagedserve does).
READY_PATH = "/v1/models"


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int

    @property
    def tokens_per_request(self) -> int:
        return self.input_len + self.output_len


# One batch of prompts per concurrency level (a few minutes per server on 2 cores).
WORKLOADS = [
    Workload("short-c64", 128, 128, 64, 64),
    Workload("short-c16", 128, 128, 16, 16),
    Workload("long-prompt-c32", 512, 128, 32, 32),
    Workload("long-prompt-c128-kv-bound", 512, 128, 128, 128),
    Workload("long-output-c32", 64, 512, 32, 32),
]


def quick(workloads: list[Workload]) -> list[Workload]:
    """A smoke-test size: a quarter of the output tokens, concurrencies kept."""
    return [Workload(w.name, w.input_len, max(8, w.output_len // 4), w.num_prompts,
                     w.concurrency) for w in workloads]


# -- servers -------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    log: Path

    def start(self) -> subprocess.Popen:
        # Its log and work files beside the log; the log gathers every start of this server.
        return start(self.command, log=self.log, append=True, env={**os.environ, **self.env},
                     cwd=self.log.parent, new_session=True)


def pagedserve_server(model: Path, port: int, kv_gib: float, logs: Path,
                      kv_dtype: str = "float32") -> Server:
    command = pagedserve_command(
        "--model", str(model), "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
        "--kv-cache-memory", str(int(kv_gib * BYTES_PER_GIB)), "--max-num-seqs", "256",
        "--kv-cache-dtype", kv_dtype)
    return Server("pagedserve", command, {}, logs / "pagedserve.log")


def vllm_server(vllm: Path, model: Path, port: int, kv_gib: float, logs: Path,
                kv_dtype: str = "float32") -> Server:
    command = [str(vllm), "serve", str(model), "--dtype", "float32", "--host", "127.0.0.1",
               "--port", str(port), "--max-num-seqs", "256"]
    if kv_dtype != "float32":  # vLLM's "auto" is the model's float32
        command += ["--kv-cache-dtype", kv_dtype]
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(int(kv_gib))}
    return Server("vllm_cpu", command, env, logs / "vllm.log")


def llama_slots(workload: Workload, kv_tokens: int) -> int:
    return max(1, min(workload.concurrency, kv_tokens // workload.tokens_per_request))


def llama_server(binary: Path, gguf: Path, port: int, workload: Workload, kv_tokens: int,
                 logs: Path, cache_type: str = "f32") -> Server:
    slots = llama_slots(workload, kv_tokens)
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(slots), "-c", str(slots * workload.tokens_per_request),
               "-t", str(os.cpu_count() or 1), "--threads-http", str(slots + 16),
               # float32 KV like the other two servers by default (llama.cpp's own default is
               # float16, which halves the bytes its attention reads; --llama-cache-type f16).
               "--cache-type-k", cache_type, "--cache-type-v", cache_type]
    return Server("llama_cpp", command, {}, logs / "llama.log")


def convert_to_gguf(llama_binary: Path, model: Path, out: Path) -> Path:
    """The checkpoint as GGUF float32, with the converter of the llama.cpp source tree that
    built ``llama_binary`` (``src/build/bin/llama-server``)."""
    src = llama_binary.resolve().parents[2]
    if out.exists():
        return out
    subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model), "--outtype",
                    "f32", "--outfile", str(out)], check=True, capture_output=True, cwd=out.parent,
                   env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
    return out


# -- clients -------------------------------------------------------------------------------


def vllm_bench(vllm: Path, base_url: str, model: Path, w: Workload, out: Path) -> dict:
    command = [str(vllm), "bench", "serve", "--backend", "openai", "--base-url", base_url,
               "--model", str(model), "--tokenizer", str(model), "--dataset-name", "random",
               "--random-input-len", str(w.input_len), "--random-output-len",
               str(w.output_len), "--num-prompts", str(w.num_prompts), "--max-concurrency",
               str(w.concurrency), "--request-rate", "inf", "--ignore-eos", "--seed", "0",
               "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
               "--result-filename", out.name]
    return _summary(run_client(command, out, {"VLLM_TARGET_DEVICE": "cpu"}), w)


def pagedserve_bench(base_url: str, model: Path, w: Workload, out: Path) -> dict:
    command = [*PAGEDSERVE, "bench", "--base-url", base_url,
               "--model", str(model), "--tokenizer", "server", "--dataset-name", "random",
               "--random-input-len", str(w.input_len), "--random-output-len",
               str(w.output_len), "--num-prompts", str(w.num_prompts), "--max-concurrency",
               str(w.concurrency), "--request-rate", "inf", "--ignore-eos", "--seed", "0",
               "--disable-tqdm", "--result-json", str(out)]
    return _summary(run_client(command, out), w)


def _summary(raw: dict, w: Workload) -> dict:
    completed = int(raw["completed"])
    duration = float(raw["duration"])
    # Output tokens of completed requests only, over the whole run's wall time.
    tokens = int(raw["total_output_tokens"])
    return {"output_tok_s": tokens / duration, "completed": completed,
            "failed": w.num_prompts - completed, "duration_s": duration,
            "mean_ttft_ms": raw.get("mean_ttft_ms"), "mean_tpot_ms": raw.get("mean_tpot_ms")}


# -- the run -------------------------------------------------------------------------------


def find_tool(given: str | None, name: str) -> tuple[Path | None, str | None]:
    """(path, None) or (None, why it is skipped)."""
    if given is None:
        found = shutil.which(name)
        if found is None:
            return None, f"not installed (not on PATH; pass --{name} PATH)"
        given = found
    path = Path(given)
    if not path.is_file() or not os.access(path, os.X_OK):
        return None, f"{path} is not an executable"
    return path, None


def run_shared_server(server: Server, base_url: str, workloads: list[Workload],
                      bench: callable, startup_timeout: float) -> dict:
    """One server for all workloads (pagedserve, vLLM)."""
    proc = server.start()
    try:
        ready_s = wait_ready(base_url, proc, startup_timeout, READY_PATH)
        results = {"startup_s": ready_s}
        for w in workloads:
            results[w.name] = bench(w)
            print(f"  {server.name:10s} {w.name:28s} {results[w.name]['output_tok_s']:8.1f} "
                  f"tok/s  completed {results[w.name]['completed']}/{w.num_prompts}",
                  flush=True)
        return results
    finally:
        stop(proc)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Hugging Face Llama directory (default: build the "
                                        "benchmark model into --work-dir)")
    parser.add_argument("--vllm", help="vLLM's executable (../shared/peers/install-vllm-cpu.sh)")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server "
                                               "(../shared/peers/install-llama-cpp.sh)")
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "vs_peers"))
    parser.add_argument("--kv-gib", type=int, default=1, help="KV cache of every server, GiB")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--quick", action="store_true", help="a quarter of the output tokens")
    parser.add_argument("--llama-cache-type", default="f32",
                        help="llama.cpp's KV cache type (f32 like the others; f16 is its default)")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="comma-separated servers to run (vLLM's client is used whenever "
                             "--vllm is given, even when its server is not run)")
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--kv-cache-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="pagedserve's and vLLM's KV cache type (with bfloat16, pass "
                             "--llama-cache-type bf16 to match it in llama.cpp)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every server this many times in turn and report each "
                             "one's median (a noisy machine drifts between servers)")
    args = parser.parse_args()

    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.model).resolve() if args.model else build_peer_model(work / "model")
    workloads = [w for w in WORKLOADS if not args.only or w.name in args.only.split(",")]
    workloads = quick(workloads) if args.quick else workloads
    kv_tokens = kv_budget_tokens(model, args.kv_gib, args.kv_cache_dtype)
    vllm, vllm_skip = find_tool(args.vllm, "vllm")
    llama, llama_skip = find_tool(args.llama_server, "llama-server")
    print(f"{os.cpu_count()} cores, load average {load_average()}, model {model}, KV budget "
          f"{args.kv_gib} GiB = {kv_tokens} tokens", flush=True)
    chosen = set(args.servers.split(","))
    skipped = {k: v for k, v in (("vllm_cpu", vllm_skip), ("llama_cpp", llama_skip)) if v}
    skipped |= {name: "not in --servers" for name in SERVERS if name not in chosen}
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", flush=True)

    def client(base_url: str, tag: str):
        def bench(w: Workload) -> dict:
            out = work / f"{tag}-{w.name}.json"
            out.unlink(missing_ok=True)
            if vllm is not None:
                return vllm_bench(vllm, base_url, model, w, out)
            return pagedserve_bench(base_url, model, w, out)
        return bench

    rounds: list[dict[str, dict]] = []
    second = None
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"round {number} of {args.rounds}", flush=True)
        rounds.append(run_round(args, model, workloads, kv_tokens, work, chosen, vllm, llama,
                                skipped, client))
        if number == 1 and "pagedserve" in chosen and vllm is not None:
            second = second_opinion(model, args, work, workloads[0])
    report(rounds, workloads, skipped, second, kv_tokens, args.kv_gib,
           args.llama_cache_type, args.kv_cache_dtype)


def run_round(args: argparse.Namespace, model: Path, workloads: list[Workload], kv_tokens: int,
              work: Path, chosen: set[str], vllm: Path | None, llama: Path | None,
              skipped: dict, client) -> dict[str, dict]:
    """Every chosen server in turn over all workloads: {server: {workload: result}}."""
    results: dict[str, dict] = {}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if "pagedserve" in chosen:
        results["pagedserve"] = run_shared_server(
            pagedserve_server(model, port, args.kv_gib, work, args.kv_cache_dtype), base,
            workloads,
            client(base, "pagedserve"), args.startup_timeout)
    if vllm is not None and "vllm_cpu" in chosen:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        try:
            results["vllm_cpu"] = run_shared_server(
                vllm_server(vllm, model, port, args.kv_gib, work, args.kv_cache_dtype), base,
                workloads,
                client(base, "vllm"), args.startup_timeout)
        except RuntimeError as exc:
            skipped["vllm_cpu"] = f"failed: {exc}"
            print(f"vllm_cpu failed: {exc}", flush=True)
    if llama is not None and "llama_cpp" in chosen:
        try:
            results["llama_cpp"] = run_llama(llama, model, workloads, kv_tokens, work, client,
                                             args.startup_timeout, args.llama_cache_type)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            skipped["llama_cpp"] = f"failed: {exc}"
            print(f"llama_cpp failed: {exc}", flush=True)
    return results


def kv_budget_tokens(model: Path, kv_gib: int, kv_dtype: str = "float32") -> int:
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    width = 4 if kv_dtype == "float32" else 2
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * width
    return kv_gib * BYTES_PER_GIB // per_token


def run_llama(binary: Path, model: Path, workloads: list[Workload], kv_tokens: int, work: Path,
              client, startup_timeout: float, cache_type: str) -> dict:
    gguf = convert_to_gguf(binary, model, work / f"{model.name}-f32.gguf")
    results: dict = {}
    for w in workloads:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = llama_server(binary, gguf, port, w, kv_tokens, work, cache_type).start()
        try:
            results.setdefault("startup_s", wait_ready(base, proc, startup_timeout, READY_PATH))
            results[w.name] = client(base, "llama")(w) | {"slots": llama_slots(w, kv_tokens)}
        finally:
            stop(proc)
        print(f"  llama_cpp  {w.name:28s} {results[w.name]['output_tok_s']:8.1f} tok/s  "
              f"completed {results[w.name]['completed']}/{w.num_prompts}  slots "
              f"{results[w.name]['slots']}", flush=True)
    return results


def second_opinion(model: Path, args: argparse.Namespace, work: Path, w: Workload) -> dict:
    """pagedserve's own client against pagedserve on the first workload."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = pagedserve_server(model, port, args.kv_gib, work, args.kv_cache_dtype).start()
    try:
        wait_ready(base, proc, args.startup_timeout, READY_PATH)
        result = pagedserve_bench(base, model, w, work / f"second-{w.name}.json")
    finally:
        stop(proc)
    print(f"  pagedserve {w.name:28s} {result['output_tok_s']:8.1f} tok/s  (pagedserve bench)",
          flush=True)
    return {"workload": w.name, "pagedserve_bench": result}


if __name__ == "__main__":
    main()
