"""Offline throughput on a ShareGPT-like workload, three ways in one run.

(a) pagedserve with the paged KV cache; (b) Hugging Face transformers ``generate`` with static
batching (left-padded batches of pagedserve's typical running batch size, each batch run until
its longest request); (c) pagedserve with the ``contiguous`` allocation policy (max_model_len
reserved per request, as pre-paging systems did) at the same KV budget as (a).

Every request generates exactly its drawn output length (ignore_eos), so all three produce the
same useful tokens; throughput = useful output tokens / wall time. Same process, same threads,
same device: ``--device cuda`` runs all three on the GPU (in ``--dtype``, bfloat16 there by
default). Last line: one JSON object.

    python -m benchmarks.throughput [--quick]
    python -m benchmarks.throughput --device cuda --hidden-size 2048 --num-layers 16
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def sharegpt_like_lengths(n: int, scale: float, seed: int) -> list[tuple[int, int]]:
    """(input, output) lengths: lognormal with the paper's ShareGPT means (161 / 338) scaled
    down by ``scale`` so the workload fits two CPU cores."""
    rng = np.random.default_rng(seed)
    sigma = 0.8
    lengths = []
    for mean in (161 * scale, 338 * scale):
        mu = math.log(mean) - sigma**2 / 2
        lengths.append(np.clip(rng.lognormal(mu, sigma, n), 4, 8 * mean).astype(int))
    return list(zip(lengths[0].tolist(), lengths[1].tolist()))


def build_checkpoint(directory: Path, hidden: int, layers: int, vocab: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
        max_position_embeddings=2048, torch_dtype="float32", tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def run_pagedserve(model_dir: Path, work: list[tuple[list[int], int]], policy: str,
                   num_kv_blocks: int, max_model_len: int, max_num_seqs: int,
                   device: str, dtype: str) -> dict:
    from pagedserve.server import LLM, SamplingParams
    from pagedserve.server.engine.worker.step_timing import add_phases

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, device=device,
              num_kv_blocks=num_kv_blocks, block_size=16, max_model_len=max_model_len,
              max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, kv_allocation=policy)
    prompts = [{"prompt_token_ids": ids} for ids, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True) for _, out in work]
    running: list[int] = []
    phases: dict[str, float] = {}

    def observe(stats) -> None:
        running.append(stats.num_running)
        add_phases(phases, stats.phase_seconds)

    llm.engine.add_step_observer(observe)
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    stats = llm.engine.stats()
    llm.engine.shutdown()
    del llm, results
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"tok_s": tokens / elapsed, "seconds": elapsed, "tokens": tokens,
            "step_phase_share": {k: round(v / elapsed, 3) for k, v in phases.items()},
            "mean_running": float(np.mean(running)) if running else 0.0,
            "max_running": max(running, default=0),
            "preemptions": stats.num_preemptions}


def run_hf(model_dir: Path, work: list[tuple[list[int], int]], batch_size: int,
           device: str, dtype: str) -> dict:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    pad = 0
    tokens = 0
    start = time.perf_counter()
    for i in range(0, len(work), batch_size):
        batch = work[i:i + batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in batch],
                                 device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in batch],
                            device=device)
        longest = max(out for _, out in batch)
        with torch.inference_mode():
            model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                           max_new_tokens=longest, min_new_tokens=longest, pad_token_id=pad)
        tokens += sum(out for _, out in batch)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"tok_s": tokens / elapsed, "seconds": elapsed, "tokens": tokens}


def print_row(system: str, result: dict, batch: str) -> None:
    print(f"{system:<28}{result['tok_s']:>10.1f}{result['seconds']:>10.1f}{batch:>12}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default=None,
                        help="float32 on CPU, bfloat16 on CUDA unless given")
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument("--num-layers", type=int, default=None)
    args = parser.parse_args()
    n, scale, hidden, layers = (args.num_requests, 0.25, 512, 8)
    if args.quick:
        n, scale, hidden, layers = 48, 0.15, 256, 4
    hidden = args.hidden_size or hidden
    layers = args.num_layers or layers
    device = args.device
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    vocab, max_model_len, max_num_seqs = 32000, 1024, 64
    rng = np.random.default_rng(args.seed)
    lengths = sharegpt_like_lengths(n, scale, args.seed)
    work = [(rng.integers(1, vocab, size=i).tolist(), o) for i, o in lengths]
    # The KV budget: room for max_num_seqs requests of the mean length when paged.
    mean_tokens = float(np.mean([i + o for i, o in lengths]))
    num_kv_blocks = int(max_num_seqs * mean_tokens / 16 * 1.2)
    # Each row is printed as soon as its run ends, so a run cut short keeps what it measured.
    print(f"{'system':<28}{'tok/s':>10}{'seconds':>10}{'mean batch':>12}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(Path(tmp), hidden, layers, vocab)
        paged = run_pagedserve(model_dir, work, "paged", num_kv_blocks, max_model_len,
                               max_num_seqs, device, dtype)
        print_row("pagedserve (paged)", paged, f"{paged['mean_running']:.1f}")
        contiguous = run_pagedserve(model_dir, work, "contiguous", num_kv_blocks,
                                    max_model_len, max_num_seqs, device, dtype)
        print_row("pagedserve (contiguous)", contiguous, f"{contiguous['mean_running']:.1f}")
        hf_batch = max(1, round(paged["mean_running"]))
        hf = run_hf(model_dir, work, hf_batch, device, dtype)
        print_row("transformers generate", hf, str(hf_batch))
    print("pagedserve (paged) step time: " + ", ".join(
        f"{k} {v:.0%}" for k, v in paged["step_phase_share"].items()))
    print(json.dumps({
        "pagedserve_tok_s": round(paged["tok_s"], 2),
        "hf_generate_tok_s": round(hf["tok_s"], 2),
        "contiguous_tok_s": round(contiguous["tok_s"], 2),
        "ratio_vs_hf": round(paged["tok_s"] / hf["tok_s"], 3),
        "ratio_vs_contiguous": round(paged["tok_s"] / contiguous["tok_s"], 3),
        "num_requests": n, "hf_batch_size": hf_batch, "num_kv_blocks": num_kv_blocks,
        "threads": torch.get_num_threads(), "device": device, "dtype": dtype,
        "hidden_size": hidden, "num_layers": layers,
        "step_phase_share": paged["step_phase_share"],
    }))


if __name__ == "__main__":
    main()
