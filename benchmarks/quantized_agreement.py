"""Greedy agreement with llama.cpp on the same GGUF file: for each of N prompts (lines of the
sonnets the load generator ships), how many leading tokens pagedserve's greedy continuation
(``--quantization gguf`` by default, offline engine) shares with llama-server's (temperature 0,
its default settings, one slot). llama.cpp's text is tokenized with the file's own tokenizer.

    python -m benchmarks.quantized_agreement --llama-server PATH [--gguf FILE] [--prompts 50]
        [--tokens 32] [--quantization gguf] [--dtype auto] [--threads N]

Last line: JSON with the median and each prompt's count of leading tokens in common.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.harness import free_port, stop, wait_ready
from benchmarks.vs_peers import Server

ROOT = Path(__file__).resolve().parents[1]
SONNETS = ROOT / "pagedserve" / "loadgen" / "sonnets.txt"


def prompts(count: int) -> list[str]:
    lines = [line.strip() for line in SONNETS.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if len(line.split()) >= 5][:count]


def llama_greedy(binary: Path, model: Path, texts: list[str], tokens: int, threads: int,
                 work: Path) -> list[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = Server("llama_cpp", [str(binary), "-m", str(model), "--host", "127.0.0.1",
                                  "--port", str(port), "-np", "1", "-t", str(threads)],
                    {}, work / "llama-agreement.log")
    proc = server.start()
    try:
        wait_ready(base, proc, 300)
        out = []
        for text in texts:
            body = json.dumps({"prompt": text, "max_tokens": tokens, "temperature": 0,
                               "ignore_eos": True}).encode()
            request = urllib.request.Request(base + "/v1/completions", body,
                                             {"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as response:
                out.append(json.loads(response.read())["choices"][0]["text"])
        return out
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--gguf", default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--quantization", default="gguf")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "agreement"))
    args = parser.parse_args(argv)
    from pagedserve.server import LLM, SamplingParams
    from pagedserve.server.models.model_path import resolve_model

    model = resolve_model(args.gguf or "smollm2")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.prompts)
    theirs = llama_greedy(Path(args.llama_server), model, texts, args.tokens, args.threads, work)
    llm = LLM(str(model), quantization=args.quantization, dtype=args.dtype,
              cpu_threads=args.threads, max_model_len=512)
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(texts, params)]
    tokenizer = llm.engine.tokenizer
    common = []
    for mine, text in zip(ours, theirs, strict=True):
        other = tokenizer.encode(text, add_special_tokens=False)
        same = 0
        while same < min(len(mine), len(other)) and mine[same] == other[same]:
            same += 1
        common.append(same)
    median = statistics.median(common)
    print(f"{len(texts)} prompts, {args.tokens} tokens each: median {median} leading tokens in "
          f"common with llama.cpp ({sum(c == args.tokens for c in common)} identical)")
    print(json.dumps({"median_common_tokens": median, "common_tokens": common,
                      "quantization": args.quantization, "dtype": args.dtype}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
