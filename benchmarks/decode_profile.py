"""Where one stream's decode step goes: the engine's phases, and inside the forward the
matmuls against everything between them.

Runs one request offline (``LLM.generate``: 128 prompt tokens, 128 greedy output tokens,
``--ignore-eos``) on a model (``smollm2`` by default, or a GGUF file / checkpoint directory),
and times every decode-only step:

- the engine's phases (``schedule``, ``prepare``, ``forward``, ``sample``, ``output``: the
  step's own ``StepTimer``);
- inside ``forward``, each call of the model's parts, by wrapping them: the projections
  (``matmul``, the LM head apart as ``lm_head``), the norms, the rotary embedding, the KV
  cache write, decode attention (with the two before it where the backend runs the three as
  one call), SiLU-and-mul, the embedding; the rest of the forward is ``python`` (the
  modules' own code, views, the loop over layers).

The parts are timed on the modules' own path: the wrappers take a model off its CPU decode
plan (``cpu_decode_plan.py``, one flat run of C calls a layer), whose Python they would not
see, so the step here carries the modules' Python (about 1 ms a step of a 1B model at one
stream) that a plain run does not. The wrappers cost about a microsecond a call, booked to
the part they wrap. For a
profile of the same run by sampling instead, run it under py-spy:

    py-spy record --native -r 500 -o decode.svg -- python -m benchmarks.decode_profile ...

    python -m benchmarks.decode_profile [--model FILE] [--threads 2] [--output-len 128]
        [--kv-cache-dtype auto] [--engine-arg name=value ...]

Last line: one JSON object, milliseconds per decode step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

PARTS = ("matmul", "lm_head", "norm", "rope", "cache_write", "attention", "silu_and_mul",
         "embedding", "python")


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


class PartTimer:
    """Seconds per part of the step, for the current step, by ``clock``."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += clock() - start
                self.calls[part] += 1
        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(model: torch.nn.Module, timer: PartTimer) -> None:
    """Wraps the model's parts in place (instance attributes, so the classes stay as they
    are)."""
    from pagedserve.server.models.attention import PagedAttention
    from pagedserve.server.models.layers import GatedMLP, RMSNorm
    from pagedserve.server.models.parallel_layers import (
        PackableLinear,
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    for module in model.modules():
        if hasattr(module, "decode_plan"):
            module.decode_plan = False  # the modules' path, whose parts the wrappers see
        if isinstance(module, ParallelLMHead):
            module.forward = timer.wrap("lm_head", module.forward)
        elif isinstance(module, PackableLinear):
            module.forward = timer.wrap("matmul", module.forward)
        elif isinstance(module, VocabParallelEmbedding):
            module.forward = timer.wrap("embedding", module.forward)
        elif isinstance(module, RMSNorm):
            module.rms_norm = timer.wrap("norm", module.rms_norm)
            module.add_rms_norm_ = timer.wrap("norm", module.add_rms_norm_)
        elif isinstance(module, GatedMLP) and module.silu_and_mul is not None:
            module.silu_and_mul = timer.wrap("silu_and_mul", module.silu_and_mul)
        elif isinstance(module, PagedAttention):
            ops = module.ops
            fused = ops.rotary_cache_decode
            module.ops = replace(
                ops, reshape_and_cache=timer.wrap("cache_write", ops.reshape_and_cache),
                paged_attention_decode=timer.wrap("attention", ops.paged_attention_decode),
                rotary_cache_decode=None if fused is None else timer.wrap("attention", fused))
        if hasattr(module, "rotary_"):
            module.rotary_ = timer.wrap("rope", module.rotary_)


def profile(model: str, output_len: int, input_len: int, engine_args: dict[str, Any],
            clock: str = "wall") -> dict:
    from pagedserve.server import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, **engine_args)
    engine, runner = llm.engine, llm.engine.runner
    parts = PartTimer(CLOCKS[clock])
    instrument(runner.model, parts)
    runner.forward = parts.wrap("forward", runner.forward)
    engine.sampler.sample = parts.wrap("sample", engine.sampler.sample)
    engine.step = parts.wrap("step", engine.step)
    steps: list[dict[str, float]] = []

    def observe(stats) -> None:
        # Called inside the step: the step's own time is booked after it returns.
        if stats.num_prefill_tokens == 0 and stats.num_decode_tokens == 1:
            steps.append(dict(parts.seconds))
        parts.reset()

    engine.add_step_observer(observe)
    vocab = engine.model_config.vocab_size
    prompt = torch.randint(0, vocab, (input_len,), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt.tolist()}], params)  # warm-up
    step_times: list[float] = []
    engine.step = _booked(engine.step, parts, step_times)
    steps.clear()
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt.tolist()}], params)
    wall = time.perf_counter() - start
    rows = [_split(row, step) for row, step in zip(steps, step_times[-len(steps):],
                                                    strict=True)]
    keys = sorted({k for row in rows for k in row})
    median_ms = {k: 1e3 * statistics.median(row.get(k, 0.0) for row in rows) for k in keys}
    return {"model": model, "clock": clock, "decode_steps": len(rows), "wall_s": wall,
            "tok_s": output_len / wall, "median_ms": median_ms,
            "threads": torch.get_num_threads()}


def _booked(step: Callable[..., Any], parts: PartTimer,
            times: list[float]) -> Callable[..., Any]:
    """``step``, recording each call's own time (the observers run inside it)."""
    def booked(*args: Any, **kwargs: Any) -> Any:
        start = parts.clock()
        try:
            return step(*args, **kwargs)
        finally:
            times.append(parts.clock() - start)
    return booked


def _split(row: dict[str, float], step: float) -> dict[str, float]:
    """One step's parts: the engine outside forward and sampler, the forward's parts, and
    ``python``, the forward's time outside its parts."""
    forward, sample = row.get("forward", 0.0), row.get("sample", 0.0)
    inside = sum(v for k, v in row.items() if k in PARTS)
    out = {k: v for k, v in row.items() if k in PARTS}
    out.update(step=step, forward=forward, sample=sample, engine=step - forward - sample,
               python=forward - inside)
    return out


def profile_server(model: str, output_len: int, input_len: int, threads: int,
                   flags: list[str], work: Path) -> dict:
    """The server loop's share: one stream through ``pagedserve serve`` and ``pagedserve
    bench``; the client's time per output token against the engine's own decode step time
    (its ``step_phase_seconds``, less one prefill step per request, taken as the request's
    time to first token)."""
    from benchmarks.harness import (
        PAGEDSERVE,
        free_port,
        pagedserve_command,
        run_client,
        running,
        wait_ready,
    )

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = pagedserve_command("--model", model, "--host", "127.0.0.1", "--port", str(port),
                                 "--max-num-seqs", "8", *flags,
                                 *(["--cpu-threads", str(threads)] if threads else []))
    bench = [*PAGEDSERVE, "bench", "--base-url", base, "--model", model, "--tokenizer",
             "server", "--dataset-name", "random", "--random-input-len", str(input_len),
             "--random-output-len", str(output_len), "--max-concurrency", "1",
             "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--disable-tqdm"]
    work.mkdir(parents=True, exist_ok=True)
    with running(command, log=work / "server.log") as process:
        wait_ready(base, process, 600)
        run_client([*bench, "--num-prompts", "1", "--result-json", str(work / "warm.json")],
                   work / "warm.json")
        before = _step_seconds(base)
        result = run_client([*bench, "--num-prompts", "4", "--result-json",
                             str(work / "run.json")], work / "run.json")
        after = _step_seconds(base)
    requests = int(result["completed"])
    steps = after[1] - before[1] - requests
    prefill_s = requests * float(result["mean_ttft_ms"]) / 1e3
    step_ms = 1e3 * (after[0] - before[0] - prefill_s) / steps
    tpot = float(result["mean_tpot_ms"])
    return {"model": model, "mean_tpot_ms": tpot, "mean_step_ms": step_ms, "steps": steps,
            "outside_step_ms": tpot - step_ms}


def _step_seconds(base: str) -> tuple[float, int]:
    """(seconds, steps) the engine has spent so far, from ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    seconds, counts = 0.0, []
    for line in text.splitlines():
        if line.startswith("pagedserve:step_phase_seconds_sum"):
            seconds += float(line.rsplit(" ", 1)[1])
        elif line.startswith("pagedserve:step_phase_seconds_count"):
            counts.append(int(float(line.rsplit(" ", 1)[1])))
    return seconds, max(counts)


def _value(text: str) -> Any:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def print_table(result: dict) -> None:
    ms = result["median_ms"]
    step = ms["step"]
    print(f"{result['model']}: {result['decode_steps']} decode steps, median step "
          f"{step:.2f} ms ({1e3 / step:.1f} tok/s) by the {result['clock']} clock, "
          f"{result['threads']} threads")
    for name in ("engine", "sample", "forward", *PARTS):
        if name in ms:
            indent = "    " if name in PARTS else "  "
            print(f"{indent}{name:16s} {ms[name]:8.3f} ms  {100 * ms[name] / step:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="thread: the main thread's CPU time, which other processes on a "
                             "busy machine do not inflate (with --threads 1 it is all of "
                             "the step's work)")
    parser.add_argument("--server", action="store_true",
                        help="measure the server loop instead: one stream through `pagedserve "
                             "serve` and `pagedserve bench`, time per output token against "
                             "the engine's step time")
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                        help="another `pagedserve serve` flag (--server-flag=--kv-cache-dtype "
                             "--server-flag=bfloat16)")
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir())
                                                  / "decode_profile"))
    parser.add_argument("--engine-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="another engine argument (vLLM's name, with underscores)")
    args = parser.parse_args(argv)
    if args.server:
        result = profile_server(args.model, args.output_len, args.input_len, args.threads,
                                args.server_flag, Path(args.work_dir))
        print(f"{result['model']}: time per output token {result['mean_tpot_ms']:.2f} ms, "
              f"engine step {result['mean_step_ms']:.2f} ms, outside the step "
              f"{result['outside_step_ms']:.2f} ms")
        print(json.dumps(result))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    engine_args: dict[str, Any] = {"kv_cache_dtype": args.kv_cache_dtype,
                                   "max_model_len": args.input_len + args.output_len + 16,
                                   "kv_cache_prefault": False}
    for item in args.engine_arg:
        name, _, value = item.partition("=")
        engine_args[name.replace("-", "_")] = _value(value)
    result = profile(args.model, args.output_len, args.input_len, engine_args, args.clock)
    print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
