"""Quantized projections against float ones on the CPU, at SmolLM2-135M's shapes (hidden 576,
intermediate 1536, vocabulary 49152): the C block-quantized kernel
(``pagedserve/kernels/cpu_block_quant.py``, on the path it chooses) on int4 in groups of 32
(GGUF's Q4_1, "block q4"; with int16 activations, "block q4 a16"), int8 in groups of 32
(Q8_0, "block q8") and random Q4_0 blocks ("block q4_0"), and
torch's int8 and int4 weight-only ops (``pagedserve/kernels/cpu_quantized_linear.py``),
against ``F.linear`` in float32 and bfloat16, and against both prepacked for oneDNN (what the
``cpu`` backend runs), per weight shape and batch rows, side by side, alternating rounds, best
of each.

A decode step at a CPU server's batch sizes streams every weight once: int8 reads a quarter
and int4 about a seventh of float32's bytes (the scales included).

    python -m benchmarks.quantized_linear [--rows 1 8 32 128 512] [--repeats 20] [--rounds 3]
        [--threads N]

``--gemv``: one decode stream, where reading the weights is the whole matmul. At the
projection shapes of a Llama-3.2-1B-sized model (hidden 2048, intermediate 8192, the head at
49152 rows), for each GGUF type and each dot-product path this CPU has, the packed weight's
bytes read per second at 1 activation row, beside a STREAM-like read probe in the same run
(``torch.sum`` over 1 GiB, on the same threads): each weight is copied until the copies pass
512 MiB and the calls cycle through them, so that every call reads its weight from memory,
not from the caches; beside the best pass through the copies, the median call's speed (on a
shared machine a pass also holds the time slices other processes take). Then the q/o and
down shapes' microseconds per call at ``--rows`` (default 8 32 512) per vector path for
Q4_0, Q4_1, Q4_K and Q8_0. ``--paths`` and ``--types`` narrow the run (``--paths vnni
--types Q4_K Q6_K Q8_0``).

On a machine shared with other busy processes, ``--threads 1`` keeps OpenMP threads from
waiting on each other (time slices of 4 ms show up as the cost of a call otherwise).

The last line is JSON: microseconds per call for each shape, rows and kernel, and each
quantized kernel's speed-up over packed float32 and packed bfloat16 (and the block kernel's over
torch's int4 op).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_block_quant, cpu_linear
from pagedserve.kernels.block_quant_weight import BlockQuantWeight, from_gguf
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.quantized_linear import QuantKernel, quantize_int4, quantize_int8

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
        q4_0 = BLOCK_QUANT_KERNEL.prepare(random_weight("Q4_0", *weight.shape))
        block = {"block q4": lambda x: BLOCK_QUANT_KERNEL.linear(x, q4, None),
                 "block q8": lambda x: BLOCK_QUANT_KERNEL.linear(x, q8, None),
                 "block q4_0": lambda x: BLOCK_QUANT_KERNEL.linear(x, q4_0, None),
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


# [out, in] of a Llama-3.2-1B-sized model's projections.
GEMV_SHAPES = {"q/o 2048x2048": (2048, 2048), "k/v 512x2048": (512, 2048),
               "gate_up 16384x2048": (16384, 2048), "down 2048x8192": (2048, 8192),
               "head 49152x2048": (49152, 2048)}
GEMV_TYPES = ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "BF16")
MULTI_ROW_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0")
MULTI_ROW_SHAPES = ("q/o 2048x2048", "down 2048x8192")
STREAMED_BYTES = 512 << 20


def random_weight(type_name: str, out: int, inp: int) -> BlockQuantWeight:
    """Random blocks of a GGUF type with sane float16 scales (16-bit types: random values)."""
    import gguf

    from tests.gguf_blocks import random_blocks

    kind = gguf.GGMLQuantizationType[type_name]
    if type_name in ("F16", "BF16"):
        dtype = torch.float16 if type_name == "F16" else torch.bfloat16
        raw = (torch.randn(out, inp) * 0.05).to(dtype).view(torch.uint8)
    else:
        raw = torch.from_numpy(random_blocks(kind, out, inp, 0))
    return from_gguf(int(kind), raw, (out, inp))


def read_probe_gbs(gib: int = 1, repeats: int = 5) -> float:
    """Bytes per second of ``torch.sum`` over ``gib`` GiB of float32, best of ``repeats``."""
    data = torch.ones(gib << 28)
    seconds = min(_best_us(lambda _: data.sum(), None, 1) for _ in range(repeats)) / 1e6
    return data.numel() * 4 / seconds / 1e9


def streamed_gbs(kernel: QuantKernel, weight: BlockQuantWeight, rows: int,
                 repeats: int) -> tuple[float, float]:
    """The weight's packed bytes read per second at ``rows`` rows, cycling through copies of
    it that together pass the caches: over the best pass through the copies, and over the
    median call (what a call reads between the time slices that other processes take from
    its threads on a shared machine)."""
    state = kernel.prepare(weight)
    size = state.packed.numel()
    copies = [state] + [dataclasses.replace(state, packed=state.packed.clone())
                        for _ in range(max(0, STREAMED_BYTES // size))]
    x = torch.randn(rows, weight.in_features)
    for copy in copies:
        kernel.linear(x, copy, None)
    best, calls = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        for copy in copies:
            called = time.perf_counter()
            kernel.linear(x, copy, None)
            calls.append(time.perf_counter() - called)
        best = min(best, (time.perf_counter() - start) / len(copies))
    return size / best / 1e9, size / statistics.median(calls) / 1e9


def gemv(args: argparse.Namespace) -> dict[str, object]:
    probe = read_probe_gbs()
    paths = [p for p in cpu_block_quant.cpu_paths() if not args.paths or p in args.paths]
    print(f"{torch.get_num_threads()} threads; read probe {probe:.1f} GB/s; paths "
          f"{', '.join(paths)}; packed GB/s at 1 row (share of the probe)", flush=True)
    results: dict[str, object] = {"read_probe_gbs": probe}
    for label, (out, inp) in GEMV_SHAPES.items():
        for type_name in args.types or GEMV_TYPES:
            weight = random_weight(type_name, out, inp)
            speeds = {p: streamed_gbs(cpu_block_quant.with_path(p), weight, 1, args.rounds)
                      for p in paths}
            results[f"{label} {type_name} 1"] = {p: gbs for p, (gbs, _) in speeds.items()}
            results[f"{label} {type_name} 1 median call"] = {
                p: call for p, (_, call) in speeds.items()}
            print(f"{label:20s} {type_name:5s} 1 row: " + "  ".join(
                f"{p} {gbs:5.1f} ({gbs / probe:.2f}; median call {call:5.1f})"
                for p, (gbs, call) in speeds.items()), flush=True)
    for label in MULTI_ROW_SHAPES:
        out, inp = GEMV_SHAPES[label]
        for type_name in [t for t in MULTI_ROW_TYPES if not args.types or t in args.types]:
            weight = random_weight(type_name, out, inp)
            kernels = {p: cpu_block_quant.with_path(p) for p in paths if p != "portable"}
            states = {p: k.prepare(weight) for p, k in kernels.items()}
            for rows in args.rows:
                x = torch.randn(rows, inp)
                times = dict.fromkeys(kernels, float("inf"))
                for _ in range(args.rounds):
                    for p, kernel in kernels.items():
                        times[p] = min(times[p], _best_us(
                            functools.partial(kernel.linear, state=states[p], bias=None), x, 3))
                results[f"{label} {type_name} {rows}"] = times
                print(f"{label:20s} {type_name:5s} {rows:3d} rows: " + "  ".join(
                    f"{p} {us:8.0f} us" for p, us in times.items()), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's")
    parser.add_argument("--gemv", action="store_true",
                        help="1B shapes: GB/s at 1 row per type and path, beside a read probe")
    parser.add_argument("--paths", nargs="+", default=None,
                        help="--gemv: only these dot-product paths (default: all this CPU has)")
    parser.add_argument("--types", nargs="+", default=None,
                        help="--gemv: only these GGUF types")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gemv:
        args.rows = args.rows or [8, 32, 512]
        print(json.dumps(gemv(args)))
        return 0
    args.rows = args.rows or [1, 8, 32, 128, 512]
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
            quantized = [q for q in ("int8", "int4", "block q4", "block q8", "block q4_0",
                                     "block q4 a16") if q in best]
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
