"""llama.cpp's presets of one model, as users download them: what pagedserve holds in memory
for each against the file's size, how well each scores a fixed text against the float32 model
next to llama.cpp's own score of the same file, and how long each takes to serve beside
llama-server.

    python -m benchmarks.gguf_presets [--llama-cpp DIR] [--work DIR]
        [--presets Q4_0,Q4_K_M,Q5_K_M,Q6_K,Q8_0] [--ctx 512] [--chunks 8] [--threads N]
        [--tiny]

The model is a random Llama-3.2-1B-shaped checkpoint (hidden 2048, 16 layers, 32 query and 8
KV heads, intermediate 8192, tied embeddings, llama3 rope scaling) with SmolLM2's vocabulary,
made into GGUF by llama.cpp's converter (bfloat16) and quantized by ``llama-quantize``
(``benchmarks/llama_cpp_tools.py``); ``--tiny`` makes a small model of the same kind to check
the script. The files are kept in ``--work`` and reused.

Per file:
- weights: pagedserve's weight bytes in memory (``--quantization gguf``) over the file's size;
- log-likelihood: the mean log-probability per token of the sonnets the load generator ships,
  scored as ``llama-perplexity`` scores it (chunks of ``--ctx`` tokens, BOS first where the
  vocabulary adds one, the second half of each chunk scored) on llama.cpp's own token ids,
  beside ``-ln(PPL)`` that ``llama-perplexity`` reports for the same file; the bfloat16 file
  read into float32 (``--quantization none``) is the float32 model;
- load: seconds from starting the server to its first 200 on /health, ``pagedserve serve``
  beside ``llama-server`` (same threads, same context), and ``load_model``'s own seconds.

Scores, memory and load times of one run are comparable with each other; the last line is
JSON. ``llama-perplexity`` is built from the same tree if it is missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import free_port, pagedserve_command, running, wait_ready
from benchmarks.llama_cpp_tools import LlamaCpp

SONNETS = Path(__file__).resolve().parents[1] / "pagedserve" / "loadgen" / "sonnets.txt"
PRESETS = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
FLOAT = "BF16"
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}


# -- the files -------------------------------------------------------------------------------

def make_checkpoint(directory: Path, shape: str, seed: int = 0) -> Path:
    """A random Llama-3.2-shaped checkpoint (bfloat16) with SmolLM2's tokenizer."""
    import torch
    import transformers

    from pagedserve.server.models.model_path import smollm2_path

    smollm2 = smollm2_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2.parent),
                                                           gguf_file=smollm2.name)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **SHAPES[shape])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def make_files(tools: LlamaCpp, work: Path, shape: str, presets: list[str]) -> dict[str, Path]:
    """Preset name → file, made unless ``work`` has it (``BF16`` is the converter's file)."""
    work.mkdir(parents=True, exist_ok=True)
    files = {FLOAT: work / f"llama-{shape}-{FLOAT}.gguf"}
    if not files[FLOAT].exists():
        checkpoint = work / f"checkpoint-{shape}"
        if not (checkpoint / "config.json").exists():
            make_checkpoint(checkpoint, shape)
        tools.convert(checkpoint, files[FLOAT], FLOAT.lower())
    for preset in presets:
        files[preset] = work / f"llama-{shape}-{preset}.gguf"
        if not files[preset].exists():
            tools.quantize(files[FLOAT], files[preset], preset, threads=os.cpu_count() or 1)
    return files


def perplexity_tool(tools: LlamaCpp) -> Path:
    binary = tools.binary("llama-perplexity")
    if not binary.is_file():
        subprocess.run(["cmake", "--build", str(tools.src / "build"), "--target",
                        "llama-perplexity", f"-j{os.cpu_count() or 1}"], check=True,
                       capture_output=True)
    return binary


# -- scores ----------------------------------------------------------------------------------

def llama_cpp_log_likelihood(binary: Path, model: Path, ctx: int, chunks: int,
                             threads: int) -> float:
    """``-ln(PPL)`` of ``llama-perplexity`` on the sonnets."""
    done = subprocess.run([str(binary), "-m", str(model), "-f", str(SONNETS), "-c", str(ctx),
                           "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads)],
                          capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"llama-perplexity printed no estimate:\n{done.stderr[-2000:]}")
    return -math.log(float(found.group(1)))


def chunk_prompts(ids: list[int], ctx: int, chunks: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: ``ctx`` tokens each, the first replaced by BOS where the
    vocabulary adds one."""
    prompts = []
    for start in range(0, min(len(ids) // ctx, chunks) * ctx, ctx):
        chunk = ids[start : start + ctx]
        prompts.append(chunk if bos is None else [bos, *chunk[1:]])
    return prompts


def pagedserve_scores(model: Path, quantization: str, prompts: list[list[int]],
                      threads: int) -> dict[str, float]:
    """Mean log-probability of the second half of each chunk (as llama-perplexity scores),
    weight bytes, and the engine's load seconds."""
    from pagedserve.server import LLM, SamplingParams
    from pagedserve.server.models.quantized_linear import weight_bytes

    started = time.perf_counter()
    llm = LLM(str(model), dtype="float32", quantization=quantization, cpu_threads=threads,
              max_model_len=len(prompts[0]) + 1, num_kv_blocks=len(prompts[0]) // 8 + 4,
              block_size=16)
    load_s = time.perf_counter() - started
    first = len(prompts[0]) // 2
    total, count = 0.0, 0
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    for prompt in prompts:
        [out] = llm.generate([{"prompt_token_ids": prompt}], params)
        for position in range(first + 1, len(prompt)):
            total += out.prompt_logprobs[position][prompt[position]].logprob
            count += 1
    result = {"log_likelihood": total / count, "tokens": count, "load_s": load_s,
              "weight_bytes": weight_bytes(llm.engine.model)}
    del llm
    gc.collect()
    return result


# -- load times ------------------------------------------------------------------------------

def llama_server_tokens(binary: Path, model: Path, ctx: int, threads: int,
                        text: str) -> tuple[float, list[int]]:
    """(seconds to serve, llama.cpp's ids of ``text`` with its special tokens)."""
    port = free_port()
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-c", str(ctx), "-t", str(threads), "-np", "1"]
    with running(command, log=Path(os.devnull)) as process:
        ready = wait_ready(f"http://127.0.0.1:{port}", process, 600)
        body = json.dumps({"content": text, "add_special": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            ids = json.loads(response.read())["tokens"]
    return ready, ids


def pagedserve_ready_s(model: Path, ctx: int, threads: int) -> float:
    port = free_port()
    command = pagedserve_command("--model", str(model), "--host", "127.0.0.1", "--port",
                                 str(port), "--max-model-len", str(ctx), "--num-kv-blocks",
                                 str(ctx // 8), "--cpu-threads", str(threads))
    with running(command, log=Path(os.devnull)) as process:
        return wait_ready(f"http://127.0.0.1:{port}", process, 600)


# -- the run ---------------------------------------------------------------------------------

def bos_to_prepend(model: Path) -> int | None:
    """The BOS id where the file's vocabulary adds one (as llama.cpp reads the flag)."""
    from gguf import GGUFReader

    fields = GGUFReader(model).fields

    def value(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    add = value("tokenizer.ggml.add_bos_token")
    if add is None:
        add = value("tokenizer.ggml.model") == "llama"
    return value("tokenizer.ggml.bos_token_id") if add else None


def measure(tools: LlamaCpp, files: dict[str, Path], args: argparse.Namespace
            ) -> dict[str, dict[str, Any]]:
    text = SONNETS.read_text(encoding="utf-8")
    server, perplexity = tools.binary("llama-server"), perplexity_tool(tools)
    results: dict[str, dict[str, Any]] = {}
    prompts: list[list[int]] = []
    for name, path in files.items():
        llama_ready, ids = llama_server_tokens(server, path, args.ctx, args.threads, text)
        prompts = prompts or chunk_prompts(ids, args.ctx, args.chunks, bos_to_prepend(path))
        quantization = "none" if name == FLOAT else "gguf"
        row = pagedserve_scores(path, quantization, prompts, args.threads)
        row.update(file_bytes=path.stat().st_size, llama_server_ready_s=llama_ready,
                   pagedserve_ready_s=pagedserve_ready_s(path, args.ctx, args.threads),
                   llama_cpp_log_likelihood=llama_cpp_log_likelihood(
                       perplexity, path, args.ctx, args.chunks, args.threads))
        row["memory_over_file"] = row["weight_bytes"] / row["file_bytes"]
        results[name] = row
        print_row(name, row, results[FLOAT])
    return results


def print_row(name: str, row: dict[str, Any], float_row: dict[str, Any]) -> None:
    print(f"{name:7s} file {row['file_bytes'] / 2**20:8.1f} MiB  weights "
          f"{row['weight_bytes'] / 2**20:8.1f} MiB ({row['memory_over_file']:.2f}x)  "
          f"log-likelihood {row['log_likelihood']:.4f} "
          f"(float32 {float_row['log_likelihood']:.4f}; llama.cpp "
          f"{row['llama_cpp_log_likelihood']:.4f})  ready {row['pagedserve_ready_s']:.1f} s "
          f"(llama-server {row['llama_server_ready_s']:.1f} s; load_model "
          f"{row['load_s']:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", help="the llama.cpp directory (default: "
                        "$LLAMA_CPP_DIR or ~/.cache/pagedserve-peers/llama.cpp)")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "pagedserve-gguf",
                        help="where the checkpoint and the files are made and kept")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tiny", action="store_true", help="a small model, to check the run")
    args = parser.parse_args(argv)
    tools = LlamaCpp.find(args.llama_cpp)
    shape = "tiny" if args.tiny else "1b"
    files = make_files(tools, args.work, shape, args.presets.split(","))
    results = measure(tools, files, args)
    print(json.dumps({"model": shape, "ctx": args.ctx, "chunks": args.chunks,
                      "threads": args.threads, "llama_cpp": tools.version(),
                      "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
