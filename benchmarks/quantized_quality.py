"""What weight quantization costs in quality and buys in memory on a real model: the per-token
log-likelihood of a fixed English text (the sonnets the load generator ships) under
``--quantization gguf`` / ``int8`` / ``int4`` against the same file dequantized to float32, and
the weight bytes each holds (the GGUF file's size beside them).

    python -m benchmarks.quantized_quality [--model smollm2] [--tokens 2000]
        [--modes none,gguf,int8,int4] [--threads N]

The text is scored in one prompt (prompt log-probabilities, one forward pass). The last line is
JSON: per mode the mean log-likelihood per token, its ratio to float32's, and the weight MiB.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.models.model_path import resolve_model
from pagedserve.server.models.quantized_linear import weight_bytes

SONNETS = Path(__file__).resolve().parents[1] / "pagedserve" / "loadgen" / "sonnets.txt"


def score(model: str, quantization: str, tokens: int, threads: int | None) -> dict[str, float]:
    llm = LLM(model, dtype="float32", quantization=quantization, cpu_threads=threads,
              max_model_len=tokens + 16)
    ids = llm.engine.tokenizer.encode(SONNETS.read_text(encoding="utf-8"))[:tokens]
    [out] = llm.generate([{"prompt_token_ids": ids}],
                         SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
    logprobs = [next(iter(p.values())).logprob for p in out.prompt_logprobs if p]
    return {"mean_logprob": sum(logprobs) / len(logprobs), "tokens": len(logprobs),
            "weight_mib": weight_bytes(llm.engine.model) / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--modes", default="none,gguf,int8,int4")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    path = resolve_model(args.model)
    results = {}
    for mode in args.modes.split(","):
        results[mode] = score(str(path), mode, args.tokens, args.threads)
        torch.set_num_threads(args.threads or torch.get_num_threads())
    base = results.get("none")
    for mode, r in results.items():
        if base:
            r["ratio_vs_float32"] = r["mean_logprob"] / base["mean_logprob"]
        print(f"{mode:5s} mean log-likelihood {r['mean_logprob']:.4f} over {r['tokens']} tokens"
              + (f" ({r['ratio_vs_float32']:.4f}x float32's)" if base else "")
              + f", weights {r['weight_mib']:.1f} MiB", flush=True)
    if path.is_file():
        print(f"file {path.stat().st_size / 2**20:.1f} MiB")
        results["file_mib"] = path.stat().st_size / 2**20
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
