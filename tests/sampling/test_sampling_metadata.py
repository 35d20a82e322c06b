"""SamplingMetadata.build: packed tensors, skipped work, and rejected input."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow, validate_token_ids

VOCAB = 10


def test_columns_and_counts_are_packed_per_row() -> None:
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, top_k=3, repetition_penalty=1.2),
                    [1, 1, 4], [2, 2, 2, 9]),
        SamplingRow(SamplingParams(temperature=0.5, top_p=0.9, frequency_penalty=0.5,
                                   logprobs=3), [0], [], seed=17),
        SamplingRow(SamplingParams(temperature=1.0, top_k=4, min_p=0.1), [5, 6], [6]),
    ]
    metadata = SamplingMetadata.build(rows, VOCAB, "cpu")
    assert metadata.greedy_mask.tolist() == [True, False, False]
    assert not metadata.all_greedy
    # Greedy rows carry neutral values for the random-only operations.
    assert metadata.temperature.tolist() == [1.0, 0.5, 1.0]
    assert metadata.top_k.tolist() == [VOCAB, VOCAB, 4]
    assert metadata.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])
    assert metadata.min_p.tolist() == pytest.approx([0.0, 0.0, 0.1])
    assert metadata.repetition_penalty.tolist() == pytest.approx([1.2, 1.0, 1.0])
    assert metadata.frequency_penalty.tolist() == [0.0, 0.5, 0.0]
    assert metadata.presence_penalty is None
    assert metadata.prompt_mask.nonzero().tolist() == [[0, 1], [0, 4], [1, 0], [2, 5], [2, 6]]
    assert metadata.output_counts.dtype == torch.int32
    assert metadata.output_counts[0].tolist() == [0, 0, 3, 0, 0, 0, 0, 0, 0, 1]
    assert metadata.output_counts[2].tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    assert metadata.seeded_rows == [(1, metadata.seeded_rows[0][1])]
    assert metadata.has_unseeded_random
    assert metadata.max_num_logprobs == 3


def test_nothing_is_built_when_nobody_asks() -> None:
    rows = [SamplingRow(SamplingParams(temperature=0.0, seed=4), [1, 2], [3], seed=4)] * 3
    metadata = SamplingMetadata.build(rows, VOCAB, "cpu")
    assert metadata.all_greedy
    skipped = (metadata.temperature, metadata.top_k, metadata.top_p, metadata.min_p,
               metadata.repetition_penalty, metadata.presence_penalty,
               metadata.frequency_penalty, metadata.prompt_mask, metadata.output_counts,
               metadata.logit_bias, metadata.blocked_mask)
    assert all(field is None for field in skipped)
    # A seed on a greedy row draws nothing.
    assert metadata.seeded_rows == [] and not metadata.has_unseeded_random
    assert metadata.max_num_logprobs == 0


def test_seeded_row_generator_seed_depends_on_output_position() -> None:
    params = SamplingParams(temperature=1.0)
    rows = [SamplingRow(params, [1], [], seed=3), SamplingRow(params, [1], [4], seed=3)]
    seeds = SamplingMetadata.build(rows, VOCAB, "cpu").seeded_rows
    assert [row for row, _ in seeds] == [0, 1]
    assert seeds[0][1] != seeds[1][1]
    assert all(0 <= seed < 2**63 for _, seed in seeds)


def test_empty_batch_samples_nothing() -> None:
    metadata = SamplingMetadata.build([], VOCAB, "cpu")
    output = Sampler(seed=0)(torch.empty(0, VOCAB), metadata)
    assert output.sampled_token_ids.shape == (0,)
    assert output.top_logprobs is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(logit_bias={VOCAB: 1.0}),
         f"logit_bias must hold token ids in [0, {VOCAB}), got {VOCAB}"),
        (SamplingParams(logit_bias={-1: 1.0}),
         f"logit_bias must hold token ids in [0, {VOCAB}), got -1"),
        (SamplingParams(allowed_token_ids=[3, 50]),
         f"allowed_token_ids must hold token ids in [0, {VOCAB}), got 50"),
        (SamplingParams(stop_token_ids=[12]),
         f"stop_token_ids must hold token ids in [0, {VOCAB}), got 12"),
        (SamplingParams(allowed_token_ids=[1, 7], stop_token_ids=[7], min_tokens=2),
         "allowed_token_ids leaves no token to sample: every allowed id is banned by "
         "bad_words, or by EOS/stop_token_ids while min_tokens is unmet"),
    ],
)
def test_out_of_range_or_unsatisfiable_ids_are_rejected(
    params: SamplingParams, message: str
) -> None:
    row = SamplingRow(params, [0], [], eos_token_id=1)
    with pytest.raises(InvalidRequestError) as raised:
        SamplingMetadata.build([row], VOCAB, "cpu")
    assert str(raised.value) == message
    assert raised.value.param == message.split(" ")[0]


def test_bad_words_ids_are_checked() -> None:
    params = SamplingParams(bad_words=["x"])
    with pytest.raises(InvalidRequestError, match=r"bad_words must hold token ids in \[0, 10\), "
                                                  r"got 10") as raised:
        validate_token_ids(params, VOCAB, bad_words_token_ids=[[2, 10]])
    assert raised.value.param == "bad_words"
    with pytest.raises(InvalidRequestError, match="must not tokenize to an empty sequence"):
        validate_token_ids(params, VOCAB, bad_words_token_ids=[[]])
    with pytest.raises(InvalidRequestError, match="ban all 2 tokens of the vocabulary"):
        validate_token_ids(params, 2, bad_words_token_ids=[[0], [1]])


def test_untokenized_bad_words_are_a_caller_error() -> None:
    row = SamplingRow(SamplingParams(bad_words=["x"]), [0], [])
    with pytest.raises(ValueError, match=r"row has bad_words \['x'\] but no bad_words_token_ids"):
        SamplingMetadata.build([row], VOCAB, "cpu")


def test_logits_must_match_the_metadata() -> None:
    metadata = SamplingMetadata.build([SamplingRow(SamplingParams(), [0], [])], VOCAB, "cpu")
    with pytest.raises(ValueError, match=r"logits of shape \(2, 10\) do not match the sampling "
                                         r"metadata, which expects \(1, 10\)"):
        Sampler(seed=0)(torch.zeros(2, VOCAB), metadata)
    with pytest.raises(TypeError, match=r"logits must be floating point, got torch\.int64"):
        Sampler(seed=0)(torch.zeros(1, VOCAB, dtype=torch.long), metadata)
    with pytest.raises(ValueError, match="vocab_size must be at least 1, got 0"):
        SamplingMetadata.build([], 0, "cpu")


def test_half_precision_logits_are_sampled_in_float32() -> None:
    rows = [SamplingRow(SamplingParams(temperature=0.0, logprobs=1), [0], [])]
    logits = torch.arange(VOCAB, dtype=torch.bfloat16).unsqueeze(0)
    output = Sampler(seed=0)(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))
    assert output.sampled_token_ids.tolist() == [VOCAB - 1]
    assert output.sampled_logprobs.dtype == torch.float32
