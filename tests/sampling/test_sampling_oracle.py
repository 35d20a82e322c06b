"""Each logits operation against the transformers processor that defines it."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow
from pagedserve.server.sampling.warpers import _ascending_order, apply_top_k_top_p

VOCAB = 64
PROMPT = [3, 9, 9, 17, 40]
OUTPUT = [9, 22, 5]
EOS = 1


def _random_logits(rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * 3


def _oracle(params: SamplingParams, logits: torch.Tensor) -> torch.Tensor:
    """The processors transformers' generate would chain for these parameters, in its order."""
    chain = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.min_tokens > 0:
        chain.append(MinNewTokensLengthLogitsProcessor(
            len(PROMPT), params.min_tokens, [EOS, *params.stop_token_ids]))
    if params.temperature > 0:
        if params.temperature != 1.0:
            chain.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k != -1:
            chain.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            chain.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0.0:
            chain.append(MinPLogitsWarper(params.min_p))
    input_ids = torch.tensor([PROMPT + OUTPUT])
    return chain(input_ids, logits.unsqueeze(0).clone()).squeeze(0)


def _assert_same_processing(processed: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(processed), torch.isinf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(processed[finite], expected[finite], rtol=1e-6, atol=1e-6)
    assert processed.argmax().item() == expected.argmax().item()


CASES = [
    SamplingParams(temperature=0.0, repetition_penalty=1.5),
    SamplingParams(temperature=0.0, repetition_penalty=0.7),
    SamplingParams(temperature=0.0, min_tokens=5, stop_token_ids=[7, 8]),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
    SamplingParams(temperature=0.8, top_k=1),
    SamplingParams(temperature=0.5, top_p=0.3, min_tokens=4),
]


def _describe(params: SamplingParams) -> str:
    default = SamplingParams()
    fields = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "min_tokens")
    return ",".join(f"{name}={getattr(params, name)}" for name in fields
                    if getattr(params, name) != getattr(default, name))


@pytest.mark.parametrize("params", CASES, ids=_describe)
def test_single_row_matches_transformers(params: SamplingParams) -> None:
    logits = _random_logits(1, seed=11)
    row = SamplingRow(params, PROMPT, OUTPUT, eos_token_id=EOS)
    metadata = SamplingMetadata.build([row], VOCAB, "cpu")
    processed = Sampler(seed=0).process_logits(logits, metadata)[0]
    _assert_same_processing(processed, _oracle(params, logits[0]))


def test_batch_of_mixed_rows_matches_transformers_row_by_row() -> None:
    logits = _random_logits(len(CASES), seed=12)
    rows = [SamplingRow(p, PROMPT, OUTPUT, eos_token_id=EOS, seed=i if i % 2 else None)
            for i, p in enumerate(CASES)]
    metadata = SamplingMetadata.build(rows, VOCAB, "cpu")
    processed = Sampler(seed=0).process_logits(logits, metadata)
    for i, params in enumerate(CASES):
        _assert_same_processing(processed[i], _oracle(params, logits[i]))


def test_greedy_token_is_argmax_of_transformers_processing() -> None:
    logits = _random_logits(3, seed=13)
    cases = [SamplingParams(temperature=0.0, repetition_penalty=p) for p in (1.0, 1.8, 0.5)]
    rows = [SamplingRow(p, PROMPT, OUTPUT, eos_token_id=EOS) for p in cases]
    output = Sampler(seed=0)(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))
    expected = [_oracle(p, logits[i]).argmax().item() for i, p in enumerate(cases)]
    assert output.sampled_token_ids.tolist() == expected


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    # Token 9 (in the prompt and the output) leads narrowly; a penalty of 2 halves it.
    logits = torch.zeros(1, VOCAB)
    logits[0, 9], logits[0, 30] = 4.0, 3.0
    sampler = Sampler(seed=0)
    plain = SamplingRow(SamplingParams(temperature=0.0), PROMPT, OUTPUT)
    penalized = SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=2.0), PROMPT, OUTPUT)
    plain_metadata = SamplingMetadata.build([plain], VOCAB, "cpu")
    assert sampler(logits, plain_metadata).sampled_token_ids.tolist() == [9]
    metadata = SamplingMetadata.build([penalized], VOCAB, "cpu")
    assert sampler(logits, metadata).sampled_token_ids.tolist() == [30]
    assert sampler.process_logits(logits, metadata)[0, 9].item() == 2.0


def test_top_p_breaks_ties_by_token_id() -> None:
    # 8192 equal logits at 0 and 1 in turn: top-p 0.5 of the upper half keeps the upper tokens
    # in id order from the highest id down, whatever order the sort met them in.
    logits = torch.zeros(1, 8192)
    logits[0, 1::2] = 1.0
    processed = apply_top_k_top_p(logits, None, torch.tensor([0.5]))
    kept = torch.isfinite(processed[0]).nonzero().squeeze(1)
    expected = _oracle(SamplingParams(temperature=1.0, top_p=0.5), logits[0])
    assert torch.isfinite(expected).sum().item() == kept.numel()
    assert kept.tolist() == list(range(8191 - 2 * (kept.numel() - 1), 8192, 2))


def test_top_k_top_p_sort_matches_a_stable_sort_with_signed_zeros_infinities_and_nan() -> None:
    logits = torch.randn(4, 8192, generator=torch.Generator().manual_seed(3))
    logits[:, ::7] = 0.25
    logits[:, 1::5] = -0.0
    logits[:, 2::9] = 0.0
    logits[:, 3::11] = float("-inf")
    logits[:, 4::13] = float("inf")
    logits[1, 5::17] = float("nan")
    order = torch.argsort(logits, dim=-1, stable=True)
    assert torch.equal(_ascending_order(logits), order)
