"""Per-step engine overhead outside the model forward, offline ``LLM.generate``.

Builds the random-weight Llama of issue 15 (hidden 512, 8 layers, 8 heads, 4 KV heads,
intermediate 1408, vocab 8192, float32) and runs a decode-heavy batch (64 prompts x 128 in,
64 out; ``--num-prompts`` for a larger batch, all running at once) greedy and sampled
(temperature 0.8, top_p 0.9). The engine's step time is split into
the forward (``ModelRunner.execute``, the logits included) and everything else (scheduling,
input packing, sampling, output processing), over the decode-only steps.

``--baseline DIR`` also runs the code of the checkout at DIR (its folders imported as
``pagedserve.*``) in alternating subprocesses, so both are measured side by side under the
same machine load, each with ``--threads`` torch threads (1 by default, steady on a shared
machine); ``--profile`` prints the top self-time functions outside the forward.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.abc
import importlib.util
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def build_checkpoint(directory: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
        torch_dtype="float32", tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    return directory


def timed(fn, bucket: list[float]):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - start)
    return wrapper


def run_once(model_dir: str, sampled: bool, profile: bool, num_prompts: int) -> dict:
    from pagedserve.server import LLM, SamplingParams

    # Room for every sequence's 192 tokens (12 blocks) at once, and the 1,200 blocks of the
    # default batch.
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", block_size=16,
              num_kv_blocks=max(1200, 13 * num_prompts), max_model_len=512,
              max_num_seqs=num_prompts, max_num_batched_tokens=2048)
    forward: list[float] = []
    runner = llm.engine.runner
    runner.execute = timed(runner.execute, forward)
    decode_steps: list[tuple[float, float]] = []  # (step, forward) of steps without prefill
    num_steps = [0]

    def observe(stats) -> None:
        num_steps[0] += 1
        if stats.num_prefill_tokens == 0:
            decode_steps.append((stats.duration_s, sum(forward)))
        forward.clear()

    llm.engine.add_step_observer(observe)
    gen = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(0, 8192, (128,), generator=gen).tolist()}
               for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.8 if sampled else 0.0, top_p=0.9 if sampled else 1.0,
                            max_tokens=64, ignore_eos=True)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    results = llm.generate(prompts, params)
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - start
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    if profiler:
        print_profile(profiler, num_steps[0])
    steps = len(decode_steps)
    step_s = sum(step for step, _ in decode_steps)
    overhead_s = sum(step - fwd for step, fwd in decode_steps)
    return {"wall_s": wall, "tok_s": tokens / wall, "decode_steps": steps,
            "step_ms": 1e3 * step_s / steps, "overhead_ms": 1e3 * overhead_s / steps}


def print_profile(profiler: cProfile.Profile, num_steps: int) -> None:
    """Top self-time Python functions outside the forward (torch ops and built-ins excluded)."""
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_, calls, self_s, _, _) in stats.stats.items():
        if path == "~" or "/models/" in path or "/kernels/" in path or "torch/nn" in path:
            continue  # built-ins (mostly torch ops) and the forward
        rows.append((self_s, calls, f"{Path(path).name}:{line}:{name}"))
    rows.sort(reverse=True)
    for self_s, calls, where in rows[:25]:
        print(f"{1e3 * self_s / num_steps:8.3f} ms/step {calls:8d} calls  {where}",
              file=sys.stderr)


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Imports ``pagedserve.<folder>`` from another checkout's top-level folders."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if len(parts) != 2 or parts[0] != "pagedserve":
            return None
        init = self.root / parts[1] / "__init__.py"
        if not init.exists():
            return None
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)])


def child(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.src:
        sys.meta_path.insert(0, CheckoutFinder(Path(args.src)))
    result = run_once(args.model_dir, args.sampled, args.profile, args.num_prompts)
    print(json.dumps(result))


def spawn(model_dir: str, src: str | None, sampled: bool, threads: int,
          num_prompts: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model-dir", model_dir,
           "--threads", str(threads), "--num-prompts", str(num_prompts)]
    cmd += ["--src", src] if src else []
    cmd += ["--sampled"] if sampled else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(args: argparse.Namespace, model_dir: str) -> dict:
    summary = {}
    for sampled in (False, True):
        runs: dict[str, list[dict]] = {"baseline": [], "current": []}
        for _ in range(args.repeats):
            runs["baseline"].append(spawn(model_dir, args.baseline, sampled, args.threads,
                                          args.num_prompts))
            runs["current"].append(spawn(model_dir, None, sampled, args.threads,
                                         args.num_prompts))
        best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
        name = "sampled" if sampled else "greedy"
        for k, r in best.items():
            print(f"{name:8s} {k:9s} {r['tok_s']:7.1f} tok/s  step {r['step_ms']:6.2f} ms  "
                  f"outside forward {r['overhead_ms']:6.2f} ms")
        summary[name] = {
            "overhead_ratio": best["current"]["overhead_ms"] / best["baseline"]["overhead_ms"],
            "throughput_ratio": best["current"]["tok_s"] / best["baseline"]["tok_s"],
            "baseline": best["baseline"], "current": best["current"]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", help="root of another checkout to compare with")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default); on a machine shared with other "
                             "jobs, more threads than idle cores make the forward erratic")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sampled", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_checkpoint(Path(tmp)))
        if args.profile:
            if args.threads:
                torch.set_num_threads(args.threads)
            print(json.dumps(run_once(model_dir, args.sampled, True, args.num_prompts)))
            return
        result = {"load": os.getloadavg()[0], "threads": args.threads,
                  "num_prompts": args.num_prompts}
        if args.baseline:
            result.update(compare(args, model_dir))
        else:
            result.update({
                "greedy": spawn(model_dir, None, False, args.threads, args.num_prompts),
                "sampled": spawn(model_dir, None, True, args.threads, args.num_prompts)})
        print(json.dumps(result))


if __name__ == "__main__":
    main()
