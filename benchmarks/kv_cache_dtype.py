"""The KV cache's element type on the CPU: speed and accuracy of a float32 model over a float32,
bfloat16 or float16 KV cache (``--kv-cache-dtype``), side by side in one run.

- Speed: offline ``LLM.generate`` of S streams at once (random 128-token prompts, 128 greedy
  output tokens, ``ignore_eos``), for S in ``--streams``; decode tokens per second, each dtype
  in turn for ``--rounds`` rounds, best round kept. ``--clock process`` divides by the
  process's CPU time instead of the wall clock: on a machine shared with other busy jobs it
  is what the run itself cost (with ``--threads 1``, tokens per CPU-second).
- Accuracy, against the float32 cache: the mean log-likelihood per token of the first
  ``--tokens`` tokens of the sonnets the load generator ships (one prompt, its prompt
  log-probabilities: every position reads the cache), and greedy agreement: ``--prompts``
  sonnet lines, 32 greedy tokens each, the leading tokens in common with the float32 cache's
  (median) and the share of prompts whose 32 tokens are all the same.

    python -m benchmarks.kv_cache_dtype [--model smollm2] [--dtypes float32,bfloat16,float16]
        [--streams 1,8,32] [--threads N] [--clock wall|process] [--skip-accuracy]
        [--skip-speed] [--quantization none]

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.models.model_path import resolve_model

SONNETS = Path(__file__).resolve().parents[1] / "pagedserve" / "loadgen" / "sonnets.txt"
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def engine(model: str, kv_dtype: str, max_model_len: int, max_num_seqs: int = 8,
           quantization: str | None = None) -> LLM:
    return LLM(model, kv_cache_dtype=kv_dtype, max_model_len=max_model_len,
               max_num_seqs=max_num_seqs, kv_cache_prefault=False, quantization=quantization,
               dtype="float32")


def decode_speed(model: str, kv_dtype: str, streams: int, clock: str) -> float:
    """Decode tokens per second (or per CPU-second) of ``streams`` requests at once."""
    llm = engine(model, kv_dtype, 288, max_num_seqs=streams)
    vocab = llm.engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(streams)
    prompts = [{"prompt_token_ids": torch.randint(0, vocab, (128,), generator=gen).tolist()}
               for _ in range(streams)]
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    decode_s = [0.0]
    tick = CLOCKS[clock]
    last = [tick()]

    def observe(stats) -> None:
        now = tick()
        if stats.num_prefill_tokens == 0:
            decode_s[0] += now - last[0]
        last[0] = now

    llm.engine.add_step_observer(observe)
    last[0] = tick()
    llm.generate(prompts, params)
    return streams * 127 / decode_s[0]


def log_likelihood(llm: LLM, tokens: int) -> float:
    ids = llm.engine.tokenizer.encode(SONNETS.read_text(encoding="utf-8"))[:tokens]
    [out] = llm.generate([{"prompt_token_ids": ids}],
                         SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
    logprobs = [next(iter(p.values())).logprob for p in out.prompt_logprobs if p]
    return sum(logprobs) / len(logprobs)


def greedy(llm: LLM, prompts: list[str], tokens: int = 32) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params)]


def leading_common(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def accuracy(model: str, dtypes: list[str], tokens: int, num_prompts: int,
             quantization: str | None = None) -> dict:
    lines = [line.strip() for line in SONNETS.read_text(encoding="utf-8").splitlines()
             if len(line.strip()) > 20][:num_prompts]
    results, reference = {}, None
    for kv_dtype in dtypes:
        llm = engine(model, kv_dtype, tokens + 64, quantization=quantization)
        outputs = greedy(llm, lines)
        results[kv_dtype] = {"mean_logprob": log_likelihood(llm, tokens)}
        if reference is None:
            reference = outputs
        common = [leading_common(a, b) for a, b in zip(outputs, reference, strict=True)]
        results[kv_dtype]["median_common_tokens"] = statistics.median(common)
        results[kv_dtype]["identical_share"] = sum(c == 32 for c in common) / len(common)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16",
                        help="the first is the reference of the accuracy columns")
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--quantization", default=None,
                        help="the model's --quantization for the accuracy runs (none: float32 "
                             "weights, so that only the KV cache rounds)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = str(resolve_model(args.model))
    dtypes = args.dtypes.split(",")
    speed: dict[str, dict[str, float]] = {d: {} for d in dtypes}
    for streams in [] if args.skip_speed else map(int, args.streams.split(",")):
        for _ in range(args.rounds):
            for kv_dtype in dtypes:
                tok_s = decode_speed(model, kv_dtype, streams, args.clock)
                key = f"s{streams}"
                speed[kv_dtype][key] = max(speed[kv_dtype].get(key, 0.0), tok_s)
        row = "  ".join(f"{d} {speed[d][f's{streams}']:8.1f}" for d in dtypes)
        print(f"{streams:3d} streams, decode tok/s ({args.clock} clock): {row}", flush=True)
    result = {"model": model, "clock": args.clock, "threads": torch.get_num_threads(),
              "decode_tok_s": speed,
              "speed_vs_first": {d: {k: v / speed[dtypes[0]][k] for k, v in speed[d].items()}
                                 for d in dtypes}, "quantization": args.quantization}
    if not args.skip_accuracy:
        result["accuracy"] = accuracy(model, dtypes, args.tokens, args.prompts,
                                      args.quantization)
        for d, r in result["accuracy"].items():
            print(f"{d:9s} log-likelihood {r['mean_logprob']:.5f}, greedy: median "
                  f"{r['median_common_tokens']} leading tokens in common with {dtypes[0]}, "
                  f"{100 * r['identical_share']:.0f}% identical", flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
