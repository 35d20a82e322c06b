"""The machine's limits and how close the engine gets to them, in one run.

1. Matmul peak: float32 square products, ``torch.mm`` and oneDNN with a prepacked weight (best
   of several), GFLOP/s.
2. Copy bandwidth: ``copy_`` of a 256 MiB tensor (bytes read + written), GB/s.
3. The engine, offline, on a decode-heavy batch of the peer model (``peer_model.py``): useful
   FLOPs/s (the matmuls of every computed token, logits of sampled tokens, attention over each
   token's context) and useful bytes/s (weights once per step, the KV each step reads and
   writes), each as a fraction of 1 and 2, with the step-time breakdown
   (schedule / prepare / forward / sample / output). Each kernel backend given runs in the
   same process, alternating, best of ``--repeat``.

On a machine whose speed drifts (a VM beside other tenants) a peak measured once, minutes
away from the run, can be off by 15%; so the oneDNN 2048² peak is measured again right before
and after every engine run, and each run's fraction is taken against the mean of those two.

    python -m benchmarks.roofline [--backends cpu,torch] [--prompts 64]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.peer_model import build_peer_model


def best_seconds(fn, repeat: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def product_gflops(n: int, onednn: bool, repeat: int = 5) -> float:
    """float32 GFLOP/s of an n² product through oneDNN with a prepacked weight (what the
    engine's linear layers use) or through torch.mm (MKL)."""
    from pagedserve.kernels import cpu_linear

    a, b = torch.randn(n, n), torch.randn(n, n)
    if onednn:
        packed = cpu_linear.pack_weight(b)
        seconds = best_seconds(lambda: cpu_linear.linear(a, packed, None), repeat, inner=3)
    else:
        seconds = best_seconds(lambda: torch.mm(a, b), repeat, inner=3)
    return 2 * n**3 / seconds / 1e9


def matmul_peak_gflops(sizes: tuple[int, ...] = (1024, 2048)) -> dict[str, float]:
    """GFLOP/s of square products through torch.mm and through oneDNN; the best of all is the
    peak."""
    from pagedserve.kernels import cpu_linear

    out = {}
    for n in sizes:
        out[f"mm {n}²"] = product_gflops(n, onednn=False)
        if cpu_linear.supports(torch.float32):
            out[f"oneDNN {n}²"] = product_gflops(n, onednn=True)
    return out


def adjacent_peak_gflops(n: int = 2048) -> float:
    """The oneDNN n² product's GFLOP/s now (the peak's usual winner), or torch.mm's where
    oneDNN does not take float32."""
    from pagedserve.kernels import cpu_linear

    return product_gflops(n, onednn=cpu_linear.supports(torch.float32), repeat=3)


def copy_bandwidth_gbs(mib: int = 256) -> float:
    src = torch.randn(mib * (1 << 20) // 4)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), repeat=5, inner=2)
    return 2 * src.numel() * 4 / seconds / 1e9


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model_dir: Path) -> Shape:
        c = json.loads((model_dir / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                   c["num_key_value_heads"], head_dim, c["intermediate_size"], c["vocab_size"])

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def kv_bytes_per_position(self) -> int:  # K and V, all layers, float32
        return 2 * self.layers * self.kv_heads * self.head_dim * 4


def useful_work(shape: Shape, prompt_len: int, output_len: int, num_seqs: int,
                num_steps: int) -> tuple[float, float]:
    """(FLOPs, bytes) of generating ``output_len`` tokens after a ``prompt_len`` prompt for
    each of ``num_seqs`` sequences in ``num_steps`` engine steps."""
    tokens = prompt_len + output_len - 1  # the last sampled token is never fed back
    linear = 2 * shape.layers * shape.layer_params * tokens
    logits = 2 * shape.hidden * shape.vocab * output_len
    # Token at position i (1-based) attends to i positions: QK and PV, 2 FLOPs per MAC each.
    attended = tokens * (tokens + 1) // 2
    attention = 4 * shape.layers * shape.heads * shape.head_dim * attended
    flops = num_seqs * (linear + logits + attention)
    weights = 4 * (shape.layers * shape.layer_params + shape.hidden * shape.vocab)
    kv_read = shape.kv_bytes_per_position * attended
    kv_written = shape.kv_bytes_per_position * tokens
    return flops, num_steps * weights + num_seqs * (kv_read + kv_written)


def run_engine(model_dir: Path, backend: str, prompts: list[list[int]], output_len: int) -> dict:
    from pagedserve.server import LLM, SamplingParams
    from pagedserve.server.engine.worker.step_timing import add_phases

    start = time.perf_counter()
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype="float32",
              kernel_backend=backend, max_num_seqs=len(prompts), max_num_batched_tokens=4096)
    startup = time.perf_counter() - start
    phases: dict[str, float] = {}
    steps: list[int] = []

    def observe(stats) -> None:
        steps.append(stats.num_decode_tokens)
        add_phases(phases, stats.phase_seconds)

    llm.engine.add_step_observer(observe)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params)  # warm caches
    steps.clear()
    phases.clear()
    start = time.perf_counter()
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    return {"backend": llm.engine.model.kernel_ops.name, "seconds": seconds,
            "tok_s": tokens / seconds, "steps": len(steps), "startup_s": startup,
            "phase_share": {k: v / seconds for k, v in phases.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Llama directory (default: build the peer model)")
    parser.add_argument("--backends", default="cpu,torch")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = Path(args.model) if args.model else build_peer_model(
        Path(tempfile.gettempdir()) / "vs_peers" / "model")
    shape = Shape.of(model_dir)
    peaks = matmul_peak_gflops()
    peak = max(peaks.values())
    bandwidth = copy_bandwidth_gbs()
    print(f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load average "
          f"{[round(x, 2) for x in os.getloadavg()]}")
    sizes = ", ".join(f"{n}: {g:.1f}" for n, g in peaks.items())
    print(f"matmul peak {peak:.1f} GFLOP/s ({sizes}), copy bandwidth {bandwidth:.1f} GB/s")
    rng = random.Random(0)
    prompts = [[rng.randrange(shape.vocab) for _ in range(args.input_len)]
               for _ in range(args.prompts)]
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for backend in args.backends.split(","):
            before = adjacent_peak_gflops()
            run = run_engine(model_dir, backend, prompts, args.output_len)
            run["adjacent_peak_gflops"] = (before + adjacent_peak_gflops()) / 2
            if backend not in best or run["seconds"] < best[backend]["seconds"]:
                best[backend] = run
    rows = {}
    for backend, run in best.items():
        flops, nbytes = useful_work(shape, args.input_len, args.output_len, args.prompts,
                                    run["steps"])
        gflops, gbs = flops / run["seconds"] / 1e9, nbytes / run["seconds"] / 1e9
        rows[backend] = run | {"useful_gflops": gflops, "fraction_of_matmul_peak": gflops / peak,
                               "fraction_of_adjacent_peak": gflops / run["adjacent_peak_gflops"],
                               "useful_gbs": gbs, "fraction_of_copy_bandwidth": gbs / bandwidth}
        run = rows[backend]
        shares = ", ".join(f"{k} {v:.0%}" for k, v in run["phase_share"].items())
        print(f"{backend:9s} {run['tok_s']:8.1f} tok/s  {gflops:6.1f} GFLOP/s = "
              f"{gflops / peak:.0%} of peak, {run['fraction_of_adjacent_peak']:.0%} of the "
              f"{run['adjacent_peak_gflops']:.1f} measured beside it  {gbs:5.1f} GB/s = "
              f"{gbs / bandwidth:.0%} of copy bandwidth  (start-up {run['startup_s']:.1f} s; "
              f"{shares})")
    names = list(rows)
    ratio = (rows[names[0]]["tok_s"] / rows[names[1]]["tok_s"]) if len(names) > 1 else None
    if ratio is not None:
        print(f"{names[0]} / {names[1]}: {ratio:.2f}x")
    print(json.dumps({"benchmark": "roofline", "cores": os.cpu_count(),
                      "torch_threads": torch.get_num_threads(),
                      "load_average": [round(x, 2) for x in os.getloadavg()],
                      "matmul_peak_gflops": peak, "copy_bandwidth_gbs": bandwidth,
                      "workload": {"prompts": args.prompts, "input_len": args.input_len,
                                   "output_len": args.output_len},
                      "engine": rows, "ratio_first_vs_second_backend": ratio}))


if __name__ == "__main__":
    main()
