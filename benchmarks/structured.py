"""Structured output's cost: the same workload with every sequence constrained by a JSON
schema and with none, and the grammar compile time per schema.

The workload is the corpus of JSON schemas in json_schemas.json (also the tests'; nested
objects, arrays, enums, bounded numbers, anyOf, $ref), each asked ``--repeats`` times with
its own seed, all submitted at once to one offline engine. The constrained run generates
until each grammar ends; the free run then asks each request for exactly as many tokens as
its constrained twin produced (``ignore_eos``), so that both runs compute the same tokens in
the same batch shapes and differ only by the grammar: the mask filled per sequence per step,
applied to the logits, and each sampled token advanced through the matcher. Runs alternate
(free, constrained, free, constrained...) and the best of each is kept, since the machine
may be shared.

Compile time: each schema compiled on a fresh compiler (a miss), then again (a hit in the
bounded cache). Default model: the embedded ``tiny`` (random weights, the 100k-token
cl100k vocabulary, so the mask has a real vocabulary's width while the model's own work is
small: the ratio is near its worst case). Last line: a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.engine_stats import StepStats
from pagedserve.server.engine.worker.step_timing import add_phases
from pagedserve.server.sampling.grammar import GrammarCompiler

SCHEMAS = json.loads((Path(__file__).parent / "json_schemas.json").read_text("utf-8"))


def _constrained(repeats: int, max_tokens: int) -> tuple[list[str], list[SamplingParams]]:
    prompts, params = [], []
    for r in range(repeats):
        for i, schema in enumerate(SCHEMAS):
            prompts.append(f"Record {r}-{i} as JSON:")
            params.append(SamplingParams(temperature=1.0, seed=1000 * r + i,
                                         max_tokens=max_tokens,
                                         structured_outputs=StructuredOutputsParams(
                                             json=schema)))
    return prompts, params


class _Phases:
    """The engine's step phases summed over one run (schedule, forward, sample, output)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def observe(self, stats: StepStats) -> None:
        add_phases(self.totals, stats.phase_seconds)


def _run(llm: LLM, prompts: list[str], params: list[SamplingParams], phases: _Phases
         ) -> tuple[float, list[int], dict[str, float]]:
    phases.totals = {}
    started = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - started
    return elapsed, [len(r.outputs[0].token_ids) for r in results], phases.totals


def compile_times(llm: LLM) -> tuple[list[float], list[float]]:
    engine = llm.engine
    compiler = GrammarCompiler.for_tokenizer(
        engine.tokenizer, engine.model_config.vocab_size, [engine.tokenizer.eos_token_id])
    misses, hits = [], []
    for schema in SCHEMAS:
        spec = StructuredOutputsParams(json=schema)
        for times in (misses, hits):
            started = time.perf_counter()
            compiler.compile(spec)
            times.append(time.perf_counter() - started)
    return misses, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=4, help="requests per schema")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    parser.add_argument("--cpu-threads", type=int, default=None)
    args = parser.parse_args()

    llm = LLM(args.model, cpu_threads=args.cpu_threads, max_model_len=1024)
    misses, hits = compile_times(llm)
    print(f"compile per schema ({len(SCHEMAS)} schemas, fresh compiler): mean "
          f"{1e3 * statistics.mean(misses):.1f} ms, median {1e3 * statistics.median(misses):.1f}"
          f" ms, max {1e3 * max(misses):.1f} ms; cache hit mean "
          f"{1e6 * statistics.mean(hits):.0f} us")

    prompts, constrained = _constrained(args.repeats, args.max_tokens)
    for spec in {p.structured_outputs.key(): p.structured_outputs for p in constrained}.values():
        llm.engine.compile_grammar(spec)  # compilation is at admission, not in the steps
    phases = _Phases()
    llm.engine.add_step_observer(phases.observe)
    _run(llm, prompts[:4], [SamplingParams(max_tokens=8)] * 4, phases)  # warm-up
    _, lengths, _ = _run(llm, prompts, constrained, phases)
    free = [SamplingParams(temperature=1.0, seed=p.seed, max_tokens=n, ignore_eos=True)
            for p, n in zip(constrained, lengths, strict=True)]
    best = {"free": float("inf"), "constrained": float("inf")}
    best_phases: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, params in (("free", free), ("constrained", constrained)):
            elapsed, got, spent = _run(llm, prompts, params, phases)
            if got != lengths:
                raise AssertionError(f"{name} run produced other lengths than the first run")
            if elapsed < best[name]:
                best[name], best_phases[name] = elapsed, spent
    tokens = sum(lengths)
    rates = {name: tokens / seconds for name, seconds in best.items()}
    print(f"{len(prompts)} requests, {tokens} output tokens (mean {tokens / len(prompts):.0f})")
    for name in ("free", "constrained"):
        split = ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds
                          in best_phases[name].items())
        print(f"  {name:<12} {best[name]:7.2f} s  {rates[name]:8.1f} tokens/s  ({split})")
    ratio = rates["constrained"] / rates["free"]
    print(f"constrained / free throughput: {ratio:.3f}")
    print(json.dumps({
        "model": args.model, "requests": len(prompts), "output_tokens": tokens,
        "free_tokens_per_s": round(rates["free"], 1),
        "constrained_tokens_per_s": round(rates["constrained"], 1),
        "constrained_over_free": round(ratio, 3),
        "compile_ms_mean": round(1e3 * statistics.mean(misses), 2),
        "compile_ms_max": round(1e3 * max(misses), 2),
        "cache_hit_us_mean": round(1e6 * statistics.mean(hits), 1),
        "sample_s": {name: round(p.get("sample", 0.0), 3) for name, p in best_phases.items()},
    }))


if __name__ == "__main__":
    main()
