"""Quantized projections against float ones on the CPU, at SmolLM2-135M's shapes (hidden 576,
intermediate 1536, vocabulary 49152): the C block-quantized kernel
(``pagedserve/kernels/cpu_block_quant.py``) on int4 in groups of 32 (GGUF's Q4_1, "block q4";
with int16 activations, "block q4 a16") and int8 in groups of 32 (Q8_0, "block q8"), and
torch's int8 and int4 weight-only ops (``pagedserve/kernels/cpu_quantized_linear.py``),
against ``F.linear`` in float32 and bfloat16, and against both prepacked for oneDNN (what the
``cpu`` backend runs), per weight shape and batch rows, side by side, alternating rounds, best
of each.

A decode step at a CPU server's batch sizes streams every weight once: int8 reads a quarter
and int4 about a seventh of float32's bytes (the scales included).

    python -m benchmarks.quantized_linear [--rows 1 8 32 128 512] [--repeats 20] [--rounds 3]
        [--threads N]

On a machine shared with other busy processes, ``--threads 1`` keeps OpenMP threads from
waiting on each other (time slices of 4 ms show up as the cost of a call otherwise).

The last line is JSON: microseconds per call for each shape, rows and kernel, and each
quantized kernel's speed-up over packed float32 and packed bfloat16 (and the block kernel's over
torch's int4 op).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_block_quant, cpu_linear
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.quantized_linear import quantize_int4, quantize_int8

# [out, in]: gate/up merged, down, the LM head; q/k/v/o are smaller than these.
SHAPES = {"gate_up 3072x576": (3072, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}


def _kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    packed = cpu_linear.pack_weight(weight)
    bf16 = weight.bfloat16()
    bf16_packed = cpu_linear.pack_weight(bf16)
    int8 = INT8_KERNEL.prepare(quantize_int8(weight))
    int4 = INT4_KERNEL.prepare(quantize_int4(weight, 32))
    block = {}
    if cpu_block_quant.available():
        (a16_kernel,) = cpu_block_quant.with_activations([BLOCK_QUANT_KERNEL], "int16")
        q4 = BLOCK_QUANT_KERNEL.prepare(quantize_int4(weight, 32))
        q8 = BLOCK_QUANT_KERNEL.prepare(quantize_int8(weight, 32))
        q4_a16 = a16_kernel.prepare(quantize_int4(weight, 32))
        block = {"block q4": lambda x: BLOCK_QUANT_KERNEL.linear(x, q4, None),
                 "block q8": lambda x: BLOCK_QUANT_KERNEL.linear(x, q8, None),
                 "block q4 a16": lambda x: a16_kernel.linear(x, q4_a16, None)}
    return {
        "f32": lambda x: F.linear(x, weight),
        "f32 packed": lambda x: cpu_linear.linear(x, packed, None),
        "bf16": lambda x: F.linear(x.bfloat16(), bf16),
        "bf16 packed": lambda x: cpu_linear.linear(x.bfloat16(), bf16_packed, None),
        "int8": lambda x: INT8_KERNEL.linear(x, int8, None),
        "int4": lambda x: INT4_KERNEL.linear(x, int4, None),
        **block,
    }


def _best_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int) -> float:
    fn(x)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    results: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{torch.get_num_threads()} threads; microseconds per call, best of "
          f"{args.rounds} x {args.repeats}; block kernel "
          f"{cpu_block_quant.chosen_path()}")
    for label, (out, inp) in SHAPES.items():
        kernels = _kernels(torch.randn(out, inp, generator=gen) * 0.05)
        for rows in args.rows:
            x = torch.randn(rows, inp, generator=gen)
            best = dict.fromkeys(kernels, float("inf"))
            for _ in range(args.rounds):
                for name, fn in kernels.items():
                    best[name] = min(best[name], _best_us(fn, x, args.repeats))
            quantized = [q for q in ("int8", "int4", "block q4", "block q8", "block q4 a16")
                         if q in best]
            ratios = {f"{q} vs {f}": best[f] / best[q] for q in quantized
                      for f in ("f32 packed", "bf16 packed", "int4") if f != q}
            results.setdefault(label, {})[str(rows)] = {**best, **ratios}
            print(f"{label:18s} rows {rows:3d}: "
                  + "  ".join(f"{k} {v:8.0f}" for k, v in best.items())
                  + "  | " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()), flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
