"""Benchmark datasets: what each request sends and how many tokens it may generate.

``random``, ``sharegpt-like``, ``alpaca-like`` and ``prefix`` build prompts of exact token
lengths; ``sharegpt`` samples real conversations from a file; ``sonnet`` draws poem lines as
vLLM's benchmark does. The same seed and tokenizer always give the same requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedserve.loadgen.bench_errors import BenchConfigError
from pagedserve.loadgen.lengths import SYNTHETIC_WORKLOADS
from pagedserve.loadgen.prompts import PromptBuilder
from pagedserve.loadgen.sharegpt import read_sharegpt, sample_sharegpt
from pagedserve.loadgen.sonnet import (
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PREFIX_LEN,
    read_poem_lines,
    sample_sonnet,
)
from pagedserve.loadgen.tokenizers import TokenCounter

DATASET_NAMES = ("random", "sharegpt", "sharegpt-like", "alpaca-like", "prefix", "sonnet")


@dataclass(frozen=True, slots=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int  # sent as max_tokens


@dataclass(slots=True)
class DatasetSpec:
    """``--dataset-name`` and the options of each dataset (vLLM's names and defaults)."""

    name: str = "random"
    path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    prefix_output_len: int = 128
    sharegpt_output_len: int | None = None
    sonnet_input_len: int = DEFAULT_INPUT_LEN
    sonnet_output_len: int = DEFAULT_OUTPUT_LEN
    sonnet_prefix_len: int = DEFAULT_PREFIX_LEN
    seed: int = 0

    def __post_init__(self) -> None:
        _require(self.name in DATASET_NAMES, "--dataset-name", self.name,
                 f"one of {DATASET_NAMES}")
        _require(self.name != "sharegpt" or bool(self.path), "--dataset-path", self.path,
                 "a ShareGPT JSON file with --dataset-name sharegpt")
        _require(0.0 <= self.random_range_ratio < 1.0, "--random-range-ratio",
                 self.random_range_ratio, "in [0, 1)")
        _require(self.random_prefix_len >= 0, "--random-prefix-len", self.random_prefix_len,
                 "non-negative")
        low_in, _ = length_range(self.random_input_len, self.random_range_ratio)
        _require(low_in + self.random_prefix_len >= 1, "--random-input-len",
                 self.random_input_len, "at least 1 at the low end of the range")
        low_out, _ = length_range(self.random_output_len, self.random_range_ratio)
        _require(low_out >= 1, "--random-output-len", self.random_output_len,
                 "at least 1 at the low end of the range")
        for option, value in (("--prefix-repetition-prefix-len", self.prefix_len),
                              ("--prefix-repetition-num-prefixes", self.num_prefixes),
                              ("--prefix-repetition-output-len", self.prefix_output_len)):
            _require(value >= 1, option, value, "at least 1")
        _require(self.suffix_len >= 0, "--prefix-repetition-suffix-len", self.suffix_len,
                 "non-negative")
        _require(self.sharegpt_output_len is None or self.sharegpt_output_len >= 1,
                 "--sharegpt-output-len", self.sharegpt_output_len, "at least 1")
        _require(self.sonnet_output_len >= 1, "--sonnet-output-len", self.sonnet_output_len,
                 "at least 1")
        _require(self.sonnet_prefix_len >= 0, "--sonnet-prefix-len", self.sonnet_prefix_len,
                 "non-negative")
        _require(self.sonnet_input_len > self.sonnet_prefix_len, "--sonnet-input-len",
                 self.sonnet_input_len, f"more than --sonnet-prefix-len ({self.sonnet_prefix_len})")


def _require(ok: bool, option: str, value: object, limit: str) -> None:
    if not ok:
        raise BenchConfigError(option, value, limit)


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's ``random`` range: integers in [floor(L·(1−r)), ceil(L·(1+r))].

    The bounds are nudged by 1e-9 so that float artefacts (10 · (1 − 0.9) = 0.99999…) do not
    move them by a whole token.
    """
    return (math.floor(length * (1.0 - range_ratio) + 1e-9),
            math.ceil(length * (1.0 + range_ratio) - 1e-9))


def dataset_rng(seed: int) -> np.random.Generator:
    """The dataset's own stream, so changing the load shape never changes the prompts."""
    return np.random.default_rng([seed, 0])


async def load_dataset(spec: DatasetSpec, num_prompts: int, counter: TokenCounter,
                       chat: bool = False) -> list[SampleRequest]:
    """``num_prompts`` requests (fewer only for a ShareGPT file with fewer valid pairs).
    ``chat``: the prompts go to the chat endpoint, which applies the chat template itself."""
    rng = dataset_rng(spec.seed)
    if spec.name == "sonnet":
        pairs = await sample_sonnet(read_poem_lines(spec.path), num_prompts, rng, counter,
                                    spec.sonnet_input_len, spec.sonnet_prefix_len,
                                    formatted=not chat)
        return [SampleRequest(p, n, spec.sonnet_output_len) for p, n in pairs]
    if spec.name == "sharegpt":
        triples = await sample_sharegpt(read_sharegpt(spec.path or ""), num_prompts, rng,
                                        counter, spec.sharegpt_output_len)
        return [SampleRequest(prompt, p_len, o_len) for prompt, p_len, o_len in triples]
    builder = PromptBuilder(counter, rng)
    if spec.name == "random":
        return await _random(spec, num_prompts, rng, builder)
    if spec.name == "prefix":
        return await _prefix(spec, num_prompts, rng, builder)
    return await _synthetic(spec.name, num_prompts, rng, builder)


async def _random(spec: DatasetSpec, num_prompts: int, rng: np.random.Generator,
                  builder: PromptBuilder) -> list[SampleRequest]:
    in_low, in_high = length_range(spec.random_input_len, spec.random_range_ratio)
    out_low, out_high = length_range(spec.random_output_len, spec.random_range_ratio)
    input_lens = rng.integers(in_low, in_high + 1, size=num_prompts)
    output_lens = rng.integers(out_low, out_high + 1, size=num_prompts)
    targets = [spec.random_prefix_len + int(n) for n in input_lens]
    if spec.random_prefix_len == 0:
        prompts = await builder.build(targets)
    else:
        (prefix,) = await builder.build([spec.random_prefix_len])
        prompts = await builder.build(targets, [prefix] * num_prompts,
                                      [spec.random_prefix_len] * num_prompts)
    return _samples(prompts, targets, output_lens.tolist())


async def _prefix(spec: DatasetSpec, num_prompts: int, rng: np.random.Generator,
                  builder: PromptBuilder) -> list[SampleRequest]:
    shared = await builder.build([spec.prefix_len] * spec.num_prefixes)
    # Interleaved then shuffled, so groups sharing a prefix are not sent back to back.
    groups = rng.permutation(np.arange(num_prompts) % spec.num_prefixes).tolist()
    target = spec.prefix_len + spec.suffix_len
    prompts = await builder.build([target] * num_prompts, [shared[g] for g in groups],
                                  [spec.prefix_len] * num_prompts)
    return _samples(prompts, [target] * num_prompts, [spec.prefix_output_len] * num_prompts)


async def _synthetic(name: str, num_prompts: int, rng: np.random.Generator,
                     builder: PromptBuilder) -> list[SampleRequest]:
    workload = SYNTHETIC_WORKLOADS[name]
    input_lens, output_lens = workload.sample_pairs(rng, num_prompts)
    prompts = await builder.build(input_lens)
    return _samples(prompts, input_lens, output_lens)


def _samples(prompts: list[str], input_lens: list[int],
             output_lens: list[int]) -> list[SampleRequest]:
    return [SampleRequest(p, int(i), int(o))
            for p, i, o in zip(prompts, input_lens, output_lens, strict=True)]
