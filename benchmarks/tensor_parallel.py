"""Tensor parallelism: throughput at each size, and what the communication costs per step.

The same offline workload (``--num-requests`` prompts of ``--prompt-len`` random tokens, each
generating exactly ``--output-len`` tokens) runs on a random-weight Llama at every
tensor-parallel size, one after the other in this process. Per size it reports output tokens
per second, the mean engine step, and the time rank 0 spends per step in the model's
collectives (two all-reduces per layer, one for the embedding, the logits gather; waiting for
the slower rank included) and in broadcasting the step message, with their share of the step.

CPU (default): TP=1 with ``--threads`` threads against TP=2 with ``--threads / 2`` threads
per rank, so both use the same cores. CUDA (``--device cuda``): TP=1/2/4/8 as far as the GPUs
go, bfloat16. Sizes can be chosen with ``--tensor-parallel-size``. Last line: one JSON object.

    python -m benchmarks.tensor_parallel [--quick]
    python -m benchmarks.tensor_parallel --device cuda --hidden-size 4096 --num-layers 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def build_checkpoint(directory: Path, hidden: int, layers: int, heads: int, kv_heads: int,
                     vocab: int, dtype: torch.dtype) -> Path:
    """A random Llama in Hugging Face layout (config.json + model.safetensors)."""
    inter = hidden * 8 // 3 // 64 * 64
    d = hidden // heads
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    gen = torch.Generator().manual_seed(0)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * 0.02).to(dtype)

    weights = {"model.embed_tokens.weight": normal(vocab, hidden),
               "lm_head.weight": normal(vocab, hidden),
               "model.norm.weight": torch.ones(hidden, dtype=dtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
            p + "self_attn.q_proj.weight": normal(heads * d, hidden),
            p + "self_attn.k_proj.weight": normal(kv_heads * d, hidden),
            p + "self_attn.v_proj.weight": normal(kv_heads * d, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * d),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        }
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"), {"format": "pt"})
    return directory


def run(model_dir: Path, size: int, args: argparse.Namespace) -> dict:
    from pagedserve.server import LLM, SamplingParams

    torch.set_num_threads(args.threads)  # the engine splits these among its ranks
    llm = LLM(str(model_dir), skip_tokenizer_init=True, dtype=args.dtype, device=args.device,
              tensor_parallel_size=size, num_kv_blocks=args.num_kv_blocks, block_size=16,
              max_num_seqs=args.num_requests, max_num_batched_tokens=2048, swap_space=0,
              max_model_len=args.prompt_len + args.output_len)
    try:
        gen = torch.Generator().manual_seed(1)
        prompts = [{"prompt_token_ids": torch.randint(0, args.vocab_size, (args.prompt_len,),
                                                      generator=gen).tolist()}
                   for _ in range(args.num_requests)]
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        llm.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm up
        steps: list[float] = []
        llm.engine.add_step_observer(lambda stats: steps.append(stats.duration_s))
        message = _time_messages(llm) if size > 1 else None
        timer = llm.engine.workers.group.timer
        timer.enabled = True
        timer.reset()
        start = time.perf_counter()
        results = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        timer.enabled = False
        tokens = sum(len(r.outputs[0].token_ids) for r in results)
        step_s = sum(steps) / len(steps)
        comm_s = timer.seconds / len(steps)
        message_s = message["seconds"] / len(steps) if message else 0.0
        return {
            "tensor_parallel_size": size, "threads_per_rank": max(1, args.threads // size),
            "tok_s": tokens / elapsed, "steps": len(steps), "step_ms": step_s * 1e3,
            "collective_ms_per_step": comm_s * 1e3, "message_ms_per_step": message_s * 1e3,
            "comm_share": (comm_s + message_s) / step_s,
            "collectives_per_step": timer.count / len(steps),
            "collective_bytes_per_step": timer.bytes / len(steps),
        }
    finally:
        llm.engine.shutdown()


def _allreduce_rank(rank: int, port: int, shape: tuple[int, ...], reps: int, out) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.randn(shape)
    for _ in range(10):
        dist.all_reduce(tensor)
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(sorted(times)[len(times) // 2])
    dist.destroy_process_group()


def allreduce_latency_us(shape: tuple[int, ...], reps: int = 200) -> float:
    """Median time of one gloo all-reduce of ``shape`` float32 between two idle processes:
    the transfer cost alone, without waiting for a slower rank."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    context = mp.get_context("spawn")
    out = context.Queue()
    ranks = [context.Process(target=_allreduce_rank, args=(r, store.port, shape, reps, out))
             for r in range(2)]
    for process in ranks:
        process.start()
    latency = out.get(timeout=120)
    for process in ranks:
        process.join(timeout=30)
    return latency * 1e6


def _time_messages(llm) -> dict:
    """Wraps the step broadcast with a clock."""
    workers = llm.engine.workers
    send, total = workers.send, {"seconds": 0.0}

    def timed(message) -> None:
        start = time.perf_counter()
        send(message)
        total["seconds"] += time.perf_counter() - start

    workers.send = timed
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tensor-parallel-size", type=int, nargs="+", default=None,
                        help="sizes to run (default: 1 2 on CPU; 1 2 4 8 up to the GPUs)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads in all")
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.dtype = "bfloat16" if cuda else "float32"
    hidden = args.hidden_size or (4096 if cuda else 512)
    layers = args.num_layers or 8
    heads, kv_heads = (32, 8) if cuda else (8, 4)
    if args.quick:
        hidden, layers, args.num_requests, args.output_len = 256, 4, 16, 32
    sizes = args.tensor_parallel_size or ([1, 2, 4, 8] if cuda else [1, 2])
    if cuda:
        sizes = [s for s in sizes if s <= torch.cuda.device_count()]
    args.num_kv_blocks = args.num_requests * -(-(args.prompt_len + args.output_len) // 16) + 16
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(Path(tmp), hidden, layers, heads, kv_heads,
                                     args.vocab_size, getattr(torch, args.dtype))
        rows = [run(model_dir, size, args) for size in sizes]
        if not cuda:  # the same cores, one rank: what splitting the model buys per thread
            one_thread = argparse.Namespace(**{**vars(args), "threads": 1})
            rows.append({**run(model_dir, 1, one_thread), "note": "TP=1, 1 thread"})
    # The decode step's all-reduce: one row per running request, hidden wide.
    decode_allreduce_us = (allreduce_latency_us((args.num_requests, hidden))
                           if not cuda and 2 in sizes else None)
    print(f"{'TP':>3}{'thr/rank':>9}{'tok/s':>9}{'step ms':>9}{'coll ms':>9}{'msg ms':>8}"
          f"{'comm %':>8}{'colls':>7}{'KiB/step':>10}")
    for r in rows:
        print(f"{r['tensor_parallel_size']:>3}{r['threads_per_rank']:>9}{r['tok_s']:>9.1f}"
              f"{r['step_ms']:>9.2f}{r['collective_ms_per_step']:>9.2f}"
              f"{r['message_ms_per_step']:>8.2f}{100 * r['comm_share']:>8.1f}"
              f"{r['collectives_per_step']:>7.0f}{r['collective_bytes_per_step'] / 1024:>10.0f}")
    if decode_allreduce_us:
        print(f"gloo all-reduce of [{args.num_requests}, {hidden}] float32 between two idle "
              f"processes: {decode_allreduce_us:.0f} us")
    base = rows[0]["tok_s"]
    print(json.dumps({
        "device": args.device, "hidden_size": hidden, "num_layers": layers,
        "num_requests": args.num_requests, "prompt_len": args.prompt_len,
        "output_len": args.output_len, "threads": args.threads,
        "results": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                    for r in rows],
        "speedup_vs_tp1": {str(r["tensor_parallel_size"]): round(r["tok_s"] / base, 3)
                           for r in rows if "note" not in r},
        "decode_allreduce_us_idle": round(decode_allreduce_us, 1) if decode_allreduce_us
        else None,
    }))


if __name__ == "__main__":
    main()
