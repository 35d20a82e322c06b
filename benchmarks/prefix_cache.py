"""Prefix caching on a few-shot workload: the same requests with the cache on and off.

As in the PagedAttention paper's shared-prefix experiment, every request is a fixed few-shot
prefix (1 or 5 example question-answer pairs of a few hundred tokens each, seeded random token
ids, so no data set is needed) followed by its own question, and asks for a short greedy answer
(``--max-tokens``, ignore_eos) so that the prompt dominates the work. One small random-weight
Llama (transformers' ``LlamaConfig`` saved to a temporary directory) serves both engines, one
with ``enable_prefix_caching=True`` and one without, in the same process under the same KV
budget and thread count. Each engine first runs one short unrelated prompt so that one-time
costs are out of the measurement; the cache starts cold, so in the cached run the first
requests of a workload compute the prefix and later ones hit it.

Measured per workload and engine: requests/s and tokens/s (prompt + output tokens over the
wall time of ``LLM.generate`` for all requests, submitted at once), mean TTFT (first token
time - arrival time, from each request's metrics), the fraction of prompt tokens served from
the cache, and whether the two engines produced the same tokens. Last line: one JSON object
with the cached-over-uncached throughput ratios and the uncached-over-cached TTFT ratios (both
> 1 when caching helps). Building the checkpoint needs transformers (the ``test`` extra).

Reading CPU numbers: the model is tiny, so attention over the long shared context costs more
than its linear layers, and the torch reference attention gathers every sequence's whole
context each step and pads a step's prefills to the longest query and context. Once the prefix
is cached, decode-only steps over that context dominate the cached run (the ``decode s``
column), which bounds the ratio well below what skipping the prefix saves in FLOPs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.engine_stats import StepStats

# Structure tokens of the synthetic prompts; content tokens are drawn above CONTENT_START.
BOS, QUESTION, ANSWER, SEPARATOR = 1, 3, 4, 5
CONTENT_START = 100
INSTRUCTION_TOKENS = 24
QUESTION_LEN = (24, 72)  # one shot's question, tokens (uniform)
ANSWER_LEN = (160, 320)  # one shot's answer
ASKED_LEN = (16, 64)  # each request's own question
SHOTS = (1, 5)


@dataclass(frozen=True, slots=True)
class FewShotWorkload:
    """One shared prefix and the distinct questions that follow it."""

    num_shots: int
    prefix: list[int]
    questions: list[list[int]]

    @property
    def name(self) -> str:
        return f"{self.num_shots}shot"

    def prompts(self) -> list[dict[str, list[int]]]:
        return [{"prompt_token_ids": self.prefix + q} for q in self.questions]


def build_workload(num_shots: int, num_requests: int, vocab_size: int, seed: int
                   ) -> FewShotWorkload:
    """A prefix of ``num_shots`` examples and ``num_requests`` questions, all seeded."""
    if vocab_size <= CONTENT_START:
        raise ValueError(f"vocab_size must exceed {CONTENT_START}, got {vocab_size}")
    rng = random.Random(f"{seed}-{num_shots}")  # each workload its own prefix and questions

    def content(bounds: tuple[int, int]) -> list[int]:
        return [rng.randrange(CONTENT_START, vocab_size) for _ in range(rng.randint(*bounds))]

    prefix = [BOS, *content((INSTRUCTION_TOKENS, INSTRUCTION_TOKENS))]
    for _ in range(num_shots):
        prefix += [QUESTION, *content(QUESTION_LEN), ANSWER, *content(ANSWER_LEN), SEPARATOR]
    questions = [[QUESTION, *content(ASKED_LEN), ANSWER] for _ in range(num_requests)]
    return FewShotWorkload(num_shots, prefix, questions)


def build_checkpoint(directory: Path, args: argparse.Namespace) -> Path:
    """A random-weight Llama saved as config.json + safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.hidden_size * 8 // 3, num_hidden_layers=args.num_layers,
        num_attention_heads=args.hidden_size // 64, num_key_value_heads=args.hidden_size // 128,
        max_position_embeddings=args.max_model_len, bos_token_id=BOS, eos_token_id=2,
        tie_word_embeddings=False, torch_dtype="float32",
        # Wider than the default 0.02, so greedy tokens have clear margins.
        initializer_range=0.1,
    )
    LlamaForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    return directory


@dataclass(slots=True)
class StepTimer:
    """Engine time split between steps that compute prompt tokens and decode-only steps."""

    prefill_step_seconds: float = 0.0
    decode_step_seconds: float = 0.0

    def __call__(self, stats: StepStats) -> None:
        if stats.num_prefill_tokens:
            self.prefill_step_seconds += stats.duration_s
        else:
            self.decode_step_seconds += stats.duration_s

    def take(self) -> StepTimer:
        """The times so far; the timer starts again from zero."""
        taken = StepTimer(self.prefill_step_seconds, self.decode_step_seconds)
        self.prefill_step_seconds = self.decode_step_seconds = 0.0
        return taken


@dataclass(slots=True)
class RunResult:
    seconds: float
    outputs: list[RequestOutput]
    steps: StepTimer

    @property
    def num_requests(self) -> int:
        return len(self.outputs)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(out.prompt_token_ids) for out in self.outputs)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(out.outputs[0].token_ids) for out in self.outputs)

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.seconds

    @property
    def mean_ttft(self) -> float:
        ttfts = [out.metrics.time_to_first_token for out in self.outputs]
        return sum(ttfts) / len(ttfts)

    @property
    def cache_hit_rate(self) -> float:
        return sum(out.num_cached_tokens for out in self.outputs) / self.num_prompt_tokens

    def token_ids(self) -> list[list[int]]:
        return [list(out.outputs[0].token_ids) for out in self.outputs]


@dataclass(slots=True)
class TimedLLM:
    llm: LLM
    timer: StepTimer


def make_llm(model_dir: Path, enable_prefix_caching: bool, args: argparse.Namespace
             ) -> TimedLLM:
    llm = LLM(str(model_dir), skip_tokenizer_init=True, dtype="float32", seed=args.seed,
              enable_prefix_caching=enable_prefix_caching, num_kv_blocks=args.num_kv_blocks,
              swap_space=0, max_model_len=args.max_model_len,
              max_num_batched_tokens=args.max_num_batched_tokens)
    # One-time costs (allocator, first kernels) on a prompt that shares nothing with the runs.
    llm.generate([{"prompt_token_ids": [BOS, *[CONTENT_START] * 40]}],
                 SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    timer = StepTimer()
    llm.engine.add_step_observer(timer)
    return TimedLLM(llm, timer)


def run(engine: TimedLLM, workload: FewShotWorkload, max_tokens: int) -> RunResult:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.timer.take()
    start = time.perf_counter()
    outputs = engine.llm.generate(workload.prompts(), params)
    seconds = time.perf_counter() - start
    return RunResult(seconds, outputs, engine.timer.take())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=None,
                        help="requests per workload (default 64; --quick: 16)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 requests each (under 60 s)")
    args = parser.parse_args(argv)
    if args.num_requests is None:
        args.num_requests = 16 if args.quick else 64
    if args.num_requests < 1:
        parser.error(f"--num-requests must be at least 1, got {args.num_requests}")
    if args.hidden_size % 128:
        parser.error(f"--hidden-size must be a multiple of 128 (heads of 64, 2 KV groups), "
                     f"got {args.hidden_size}")
    return args


def _row(label: str, result: RunResult) -> str:
    return (f"{label:<18}{result.requests_per_s:>9.2f}{result.tokens_per_s:>10.0f}"
            f"{1000 * result.mean_ttft:>11.0f}{result.cache_hit_rate:>9.2f}"
            f"{result.seconds:>9.1f}{result.steps.prefill_step_seconds:>10.1f}"
            f"{result.steps.decode_step_seconds:>10.1f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = [build_workload(shots, args.num_requests, args.vocab_size, args.seed)
                 for shots in SHOTS]
    for workload in workloads:
        print(f"{workload.name}: prefix {len(workload.prefix)} tokens, {args.num_requests} "
              f"requests, mean question "
              f"{sum(map(len, workload.questions)) / len(workload.questions):.0f} tokens, "
              f"{args.max_tokens} output tokens each")
    summary: dict[str, float | bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(Path(tmp), args)
        engines = {cached: make_llm(model_dir, cached, args) for cached in (False, True)}
        print("prefill s / decode s: engine time in steps that compute prompt tokens / in "
              "decode-only steps")
        print(f"{'run':<18}{'req/s':>9}{'tok/s':>10}{'TTFT ms':>11}{'hit rate':>9}"
              f"{'seconds':>9}{'prefill s':>10}{'decode s':>10}")
        for workload in workloads:
            uncached = run(engines[False], workload, args.max_tokens)
            cached = run(engines[True], workload, args.max_tokens)
            print(_row(f"{workload.name} uncached", uncached))
            print(_row(f"{workload.name} cached", cached))
            sys.stdout.flush()
            summary[f"throughput_ratio_{workload.name}"] = round(
                cached.requests_per_s / uncached.requests_per_s, 3)
            summary[f"ttft_ratio_{workload.name}"] = round(uncached.mean_ttft / cached.mean_ttft, 3)
            summary[f"cache_hit_rate_{workload.name}"] = round(cached.cache_hit_rate, 4)
            summary[f"outputs_match_{workload.name}"] = cached.token_ids() == uncached.token_ids()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
