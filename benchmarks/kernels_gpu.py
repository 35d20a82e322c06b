"""Decode attention on one GPU: the Triton paged kernel against torch SDPA on contiguous K/V.

Shapes: 32 query heads, 8 KV heads, head dim 128, bf16, block size 16, batch 1/8/64/256 at
contexts 512/2k/8k. First every op is checked against the torch reference on ragged, shuffled
inputs; then each case is timed as a CUDA graph replay (no Python launch cost in the numbers)
after a 256 MiB L2 flush, median of ``--reps``. Bandwidth is KV bytes read over kernel time,
as a fraction of the device's peak (table by name, or ``--peak-gbps``). SDPA runs on the same
K/V laid out [S, Hkv, L, D], the GQA group folded into the query length. The last line printed
is one JSON object.

    python -m benchmarks.kernels_gpu [--peak-gbps 4800] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
GROUP = NUM_HEADS // NUM_KV_HEADS
DTYPE = torch.bfloat16
SCALE = HEAD_DIM**-0.5
BF16_TOLERANCE = 2e-2
FLUSH_BYTES = 256 * 2**20
# HBM bandwidth in GB/s, matched by substring in order (longer names first). GH200 ships with
# either HBM3 or HBM3e, so it needs --peak-gbps.
PEAK_GBPS = (
    ("GH200", None), ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0),
    ("H100", 3350.0), ("H800", 3350.0), ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0), ("B200", 8000.0), ("L40S", 864.0), ("L40", 864.0), ("L4", 300.0),
    ("A10G", 600.0), ("RTX 4090", 1008.0),
)


def peak_gbps_for(name: str) -> float | None:
    for marker, gbps in PEAK_GBPS:
        if marker.lower() in name.lower():
            return gbps
    return None


def graph_time_us(fn: Callable[[], object], reps: int, flush: torch.Tensor) -> float:
    """Median time of one replay of ``fn`` captured in a CUDA graph, L2 flushed before each."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile the kernels and warm the allocator outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1000.0


def paged_from_contiguous(key: torch.Tensor, value: torch.Tensor, seed: int):
    """Scatter contiguous K/V [S, Hkv, L, D] into shuffled blocks of a paged pool."""
    num_seqs, _, context, _ = key.shape
    blocks_per_seq = context // BLOCK_SIZE
    gen = torch.Generator(device=key.device).manual_seed(seed)
    order = torch.randperm(num_seqs * blocks_per_seq, generator=gen, device=key.device)
    block_tables = order.view(num_seqs, blocks_per_seq).to(torch.int32)

    def to_blocks(x: torch.Tensor) -> torch.Tensor:
        # [S, Hkv, nb*B, D] -> [S*nb, B, Hkv, D]
        x = x.view(num_seqs, NUM_KV_HEADS, blocks_per_seq, BLOCK_SIZE, HEAD_DIM)
        return x.permute(0, 2, 3, 1, 4).reshape(-1, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)

    pool_shape = (num_seqs * blocks_per_seq, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.empty(pool_shape, dtype=key.dtype, device=key.device)
    value_cache = torch.empty_like(key_cache)
    key_cache[order] = to_blocks(key)
    value_cache[order] = to_blocks(value)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=key.device)
    return key_cache, value_cache, block_tables, seq_lens


def ragged_inputs(num_seqs: int, max_len: int, seed: int, device: torch.device):
    """A ragged batch over shuffled blocks, with one spare zero column in the block table."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (num_seqs,), generator=gen)
    widths = (lens + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = int(widths.sum()) + 1
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(num_seqs, int(widths.max()) + 1, dtype=torch.int32)
    for seq, width in enumerate(widths.tolist()):
        tables[seq, :width] = torch.tensor(order[:width], dtype=torch.int32)
        order = order[width:]
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, generator=gen).to(device, DTYPE)
    value_cache = torch.randn(shape, generator=gen).to(device, DTYPE)
    return key_cache, value_cache, tables.to(device), lens.to(device, torch.int32)


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).abs().max())


def correctness_checks(device: torch.device) -> dict[str, float]:
    """Max abs error of every Triton op against the torch reference (0.0 = bit-exact)."""
    from pagedserve.kernels import triton as tri
    from pagedserve.kernels.dispatch import get_kernel_ops

    ref = get_kernel_ops(device, backend="torch")
    key_cache, value_cache, tables, lens = ragged_inputs(8, 3000, 0, device)
    query = torch.randn(8, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    args = (query, key_cache, value_cache, tables, lens, SCALE)
    expected = ref.paged_attention_decode(*args)
    errors = {
        "decode_default": max_error(tri.paged_attention_decode(*args), expected),
        "decode_unsplit": max_error(
            tri.paged_attention_decode(*args, config=tri.DecodeConfig(kv_tile=64)), expected),
        "decode_split": max_error(tri.paged_attention_decode(
            *args, config=tri.DecodeConfig(kv_tile=64, partition_size=256)), expected),
    }
    query_lens = torch.minimum(lens, torch.tensor([300, 1, 57, 128, 1, 2, 513, 16], device=device))
    starts = torch.zeros(9, dtype=torch.int32, device=device)
    starts[1:] = torch.cumsum(query_lens, 0)
    chunk = torch.randn(int(starts[-1]), NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    prefill_args = (chunk, key_cache, value_cache, tables, starts, lens, SCALE)
    errors["prefill_default"] = max_error(
        tri.paged_attention_prefill(*prefill_args), ref.paged_attention_prefill(*prefill_args))
    errors.update(_cache_op_errors(tri, ref, key_cache, device))
    return errors


def _cache_op_errors(tri, ref, key_cache, device) -> dict[str, float]:
    rows = torch.randn(64, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    slots = torch.randperm(key_cache.shape[0] * BLOCK_SIZE, device=device)[:64]
    slots[::7] = -1
    mapping = torch.tensor([[3, 9], [12, 1], [0, 5]])
    got, want = key_cache.clone(), key_cache.clone()
    tri.reshape_and_cache(rows, rows, got, got.clone(), slots)
    ref.reshape_and_cache(rows, rows, want, want.clone(), slots)
    errors = {"reshape_and_cache": max_error(got, want)}
    tri.copy_blocks([got], [got.clone()], mapping)
    ref.copy_blocks([want], [want.clone()], mapping)
    errors["copy_blocks"] = max_error(got, want)
    cpu_pool = torch.zeros(16, *key_cache.shape[1:], dtype=DTYPE)
    tri.swap_blocks(got, cpu_pool, mapping)
    back = torch.zeros_like(got)
    tri.swap_blocks(cpu_pool, back, mapping[:, [1, 0]])
    errors["swap_blocks_round_trip"] = max_error(back[mapping[:, 0]], got[mapping[:, 0]])
    return errors


def bench_case(batch: int, context: int, reps: int, flush: torch.Tensor, peak: float | None,
               device: torch.device) -> dict[str, object]:
    from pagedserve.kernels import triton as tri
    from pagedserve.kernels.triton.checks import AttentionShape

    key = torch.randn(batch, NUM_KV_HEADS, context, HEAD_DIM, device=device, dtype=DTYPE)
    value = torch.randn_like(key)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    key_cache, value_cache, tables, lens = paged_from_contiguous(key, value, seed=batch + context)
    args = (query, key_cache, value_cache, tables, lens, SCALE)
    # The GQA group as query positions: q [S, Hkv, G, D] against k/v [S, Hkv, L, D].
    grouped = query.view(batch, NUM_KV_HEADS, GROUP, HEAD_DIM)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(grouped, key, value, scale=SCALE)

    kv_bytes = 2 * key.numel() * key.element_size()
    config = tri.choose_decode_config(
        AttentionShape(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                                  tables.shape[1]),
        batch, torch.cuda.get_device_properties(device).multi_processor_count,
    )
    triton_us = graph_time_us(lambda: tri.paged_attention_decode(*args), reps, flush)
    sdpa_us = graph_time_us(sdpa, reps, flush)
    result: dict[str, object] = {
        "batch": batch, "context": context, "kv_bytes": kv_bytes,
        "splits": config.num_splits(context),
        "triton_us": round(triton_us, 2), "sdpa_us": round(sdpa_us, 2),
        "triton_gbps": round(kv_bytes / triton_us / 1e3, 1),
        "sdpa_gbps": round(kv_bytes / sdpa_us / 1e3, 1),
        "triton_peak_fraction": round(kv_bytes / triton_us / 1e3 / peak, 3) if peak else None,
        "speedup_vs_sdpa": round(sdpa_us / triton_us, 3),
        "max_abs_err_vs_sdpa": max_error(
            tri.paged_attention_decode(*args), sdpa().reshape(batch, NUM_HEADS, HEAD_DIM)),
    }
    if config.partition_size is not None:
        unsplit = tri.DecodeConfig(kv_tile=config.kv_tile)
        result["unsplit_us"] = round(graph_time_us(
            lambda: tri.paged_attention_decode(*args, config=unsplit), reps, flush), 2)
    return result


def _print_case(case: dict[str, object]) -> None:
    fraction = case["triton_peak_fraction"]
    peak_text = f"{fraction:.0%} of peak" if fraction is not None else "peak unknown"
    unsplit = f" unsplit {case['unsplit_us']:9.1f} us" if "unsplit_us" in case else ""
    print(f"batch {case['batch']:4d} ctx {case['context']:5d} splits {case['splits']:3d}: "
          f"triton {case['triton_us']:9.1f} us {case['triton_gbps']:7.0f} GB/s ({peak_text}), "
          f"sdpa {case['sdpa_us']:9.1f} us, x{case['speedup_vs_sdpa']:.2f}{unsplit}, "
          f"err {case['max_abs_err_vs_sdpa']:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-gbps", type=float, help="device HBM bandwidth in GB/s")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_gpu: no CUDA device here; this benchmark times the Triton kernels on a "
              "GPU (the CPU tests run them under TRITON_INTERPRET=1 instead)", file=sys.stderr)
        return 2
    bad = [c for c in args.contexts if c % BLOCK_SIZE]
    if bad:
        parser.error(f"contexts {bad} must be multiples of the block size {BLOCK_SIZE}")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = args.peak_gbps or peak_gbps_for(name)
    summary: dict[str, object] = {
        "benchmark": "kernels_gpu", "device": name, "peak_gbps": peak, "dtype": "bfloat16",
        "num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
        "block_size": BLOCK_SIZE,
    }
    errors = correctness_checks(device)
    summary["max_abs_err_vs_torch_reference"] = errors
    summary["correct"] = all(err <= BF16_TOLERANCE for err in errors.values())
    print(f"{name}: peak {peak} GB/s; max abs error vs the torch reference: {errors}")
    if not summary["correct"]:
        print(json.dumps(summary))
        return 1
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    cases = []
    for batch in args.batches:
        for context in args.contexts:
            cases.append(bench_case(batch, context, args.reps, flush, peak, device))
            _print_case(cases[-1])
            torch.cuda.empty_cache()
    summary["cases"] = cases
    summary["correct"] = all(c["max_abs_err_vs_sdpa"] <= BF16_TOLERANCE for c in cases)
    print(json.dumps(summary))
    return 0 if summary["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
