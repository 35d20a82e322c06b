"""What one step of sampling costs on CPU, per setting: the sampler as the ``cpu`` kernel
backend builds it (C argmax, exponential race and top-k / top-p) against the sampler on
torch alone, side by side, alternating rounds, best of each.

A served batch samples every running sequence every step; at 64 rows of an 8k vocabulary,
top-p on torch sorts every row (about a quarter of a decode step of the peer model).

    python -m benchmarks.sampler [--rows 64] [--vocab 8192] [--repeats 30] [--rounds 3]

The last line is JSON: milliseconds per step for each setting and path, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.kernels import cpu_sampling
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow

SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 0.8": SamplingParams(temperature=0.8),
    "top_p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "top_k 50": SamplingParams(temperature=1.0, top_k=50),
    "top_k 50, top_p 0.9": SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
}


def _best_ms(sampler: Sampler, logits: torch.Tensor, metadata: SamplingMetadata,
             repeats: int) -> float:
    sampler(logits, metadata)
    start = time.perf_counter()
    for _ in range(repeats):
        sampler(logits, metadata)
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    # Logits shaped like a model's: most of the mass on a few hundred tokens.
    logits = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
    kernels = Sampler(seed=0, cpu_race=cpu_sampling.exponential_race,
                      cpu_argmax=cpu_sampling.argmax, top_k_top_p=cpu_sampling.top_k_top_p)
    plain = Sampler(seed=0)
    results = {}
    print(f"{torch.get_num_threads()} threads, {args.rows} rows x vocab {args.vocab}")
    for name, params in SETTINGS.items():
        rows = [SamplingRow(params, [1], []) for _ in range(args.rows)]
        metadata = SamplingMetadata.build(rows, args.vocab, "cpu")
        best = {"cpu": float("inf"), "torch": float("inf")}
        for _ in range(args.rounds):
            best["cpu"] = min(best["cpu"], _best_ms(kernels, logits, metadata, args.repeats))
            best["torch"] = min(best["torch"], _best_ms(plain, logits, metadata, args.repeats))
        ratio = best["torch"] / best["cpu"]
        results[name] = {"cpu_ms": round(best["cpu"], 3), "torch_ms": round(best["torch"], 3),
                         "speedup": round(ratio, 2)}
        print(f"{name:22s} cpu backend {best['cpu']:7.2f} ms   torch {best['torch']:7.2f} ms"
              f"   {ratio:5.1f}x")
    print(json.dumps({"benchmark": "sampler", "rows": args.rows, "vocab": args.vocab,
                      "threads": torch.get_num_threads(), "settings": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
