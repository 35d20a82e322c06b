"""Presence/frequency penalties, logit_bias and the blocked-token mask."""

from __future__ import annotations

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow

VOCAB = 16
NEG_INF = float("-inf")


def _process(rows: list[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
    return Sampler(seed=0).process_logits(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))


def _greedy(rows: list[SamplingRow], logits: torch.Tensor) -> list[int]:
    output = Sampler(seed=0)(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))
    return output.sampled_token_ids.tolist()


def test_presence_and_frequency_follow_the_openai_formula() -> None:
    logits = torch.linspace(-2.0, 2.0, VOCAB).repeat(2, 1)
    output = [4, 4, 4, 7, 11, 4]
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25)
    rows = [
        SamplingRow(params, prompt_token_ids=[2, 3], output_token_ids=output),
        SamplingRow(SamplingParams(temperature=0.0), [2, 3], output),
    ]
    counts = torch.bincount(torch.tensor(output), minlength=VOCAB).float()
    expected = logits[0] - counts * 0.25 - (counts > 0).float() * 0.5
    processed = _process(rows, logits)
    torch.testing.assert_close(processed[0], expected, rtol=0, atol=1e-6)
    # Prompt tokens 2 and 3 are not penalised, and the neighbouring row is untouched.
    assert processed[0, 2].item() == logits[0, 2].item()
    assert torch.equal(processed[1], logits[1])


def test_negative_presence_penalty_promotes_repeated_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 0.4
    params = SamplingParams(temperature=0.0, presence_penalty=-1.0)
    assert _greedy([SamplingRow(params, [], [5])], logits) == [5]


def test_logit_bias_is_added_per_row() -> None:
    logits = torch.zeros(3, VOCAB)
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, logit_bias={3: 5.0, 9: -100.0}), [1], []),
        SamplingRow(SamplingParams(temperature=0.0), [1], []),
        SamplingRow(SamplingParams(temperature=0.0, logit_bias={12: 0.5}), [1], []),
    ]
    processed = _process(rows, logits)
    assert processed[0, 3].item() == 5.0 and processed[0, 9].item() == -100.0
    assert torch.count_nonzero(processed[1]).item() == 0
    assert processed[2, 12].item() == 0.5
    assert _greedy(rows, logits) == [3, 0, 12]


def test_allowed_token_ids_mask_everything_else() -> None:
    logits = torch.arange(VOCAB, dtype=torch.float32).repeat(2, 1)
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=[2, 5]), [0], []),
        SamplingRow(SamplingParams(temperature=0.0), [0], []),
    ]
    processed = _process(rows, logits)
    assert torch.isfinite(processed[0]).nonzero().flatten().tolist() == [2, 5]
    assert torch.isfinite(processed[1]).all()
    assert _greedy(rows, logits) == [5, 15]


def test_random_rows_never_leave_the_allowed_set() -> None:
    logits = torch.zeros(200, VOCAB)
    params = SamplingParams(temperature=1.0, allowed_token_ids=[3, 7])
    rows = [SamplingRow(params, [0], [], seed=s) for s in range(200)]
    assert set(_greedy(rows, logits)) == {3, 7}


def test_logit_bias_cannot_revive_a_token_outside_allowed() -> None:
    logits = torch.zeros(1, VOCAB)
    params = SamplingParams(temperature=0.0, allowed_token_ids=[4], logit_bias={6: 100.0})
    assert _greedy([SamplingRow(params, [0], [])], logits) == [4]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(4, VOCAB)
    logits[:, 1] = 9.0  # EOS leads
    logits[:, 8] = 8.0  # then the stop token
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[8])
    ignore_eos = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[8],
                                ignore_eos=True)
    rows = [
        SamplingRow(params, [0], [5, 6], eos_token_id=1),  # 2 < 3: both masked
        SamplingRow(params, [0], [5, 6, 7], eos_token_id=1),  # reached: nothing masked
        SamplingRow(ignore_eos, [0], [5], eos_token_id=1),  # EOS masked even under ignore_eos
        SamplingRow(SamplingParams(temperature=0.0), [0], [], eos_token_id=1),
    ]
    processed = _process(rows, logits)
    assert torch.isinf(processed[0]).nonzero().flatten().tolist() == [1, 8]
    assert torch.isinf(processed[2]).nonzero().flatten().tolist() == [1, 8]
    assert torch.isfinite(processed[1]).all() and torch.isfinite(processed[3]).all()
    assert _greedy(rows, logits) == [0, 1, 0, 1]


def test_single_token_bad_word_is_always_banned() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 6] = 3.0
    params = SamplingParams(temperature=0.0, bad_words=["six"])
    row = SamplingRow(params, [0], [], bad_words_token_ids=[[6]])
    assert _greedy([row], logits) == [0]


def test_multi_token_bad_word_bans_its_last_token_after_its_prefix() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 9] = 3.0
    params = SamplingParams(temperature=0.0, bad_words=["seven eight nine"])
    word = [[7, 8, 9]]
    rows = [
        SamplingRow(params, [0], [2, 7, 8], bad_words_token_ids=word),  # prefix matches
        SamplingRow(params, [0], [7, 2, 8], bad_words_token_ids=word),  # no match
        SamplingRow(params, [7], [8], bad_words_token_ids=word),  # prompt does not count
    ]
    processed = _process(rows, logits)
    assert torch.isinf(processed[0]).nonzero().flatten().tolist() == [9]
    assert torch.isfinite(processed[1]).all() and torch.isfinite(processed[2]).all()
    assert _greedy(rows, logits) == [0, 9, 9]


def test_bad_word_ban_yields_when_it_would_leave_nothing_to_sample() -> None:
    logits = torch.zeros(1, VOCAB)
    params = SamplingParams(temperature=0.0, allowed_token_ids=[4, 9], bad_words=["a", "b c"])
    row = SamplingRow(params, [0], [3, 5], eos_token_id=1, bad_words_token_ids=[[4], [5, 9]])
    assert _greedy([row], logits) == [9]


def test_penalties_apply_to_greedy_and_random_rows_alike() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    greedy = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    random = SamplingParams(temperature=1.0, frequency_penalty=1.0)
    rows = [SamplingRow(greedy, [0], [2, 2]), SamplingRow(random, [0], [2, 2], seed=1)]
    processed = _process(rows, torch.cat([logits[:1], logits[:1]]))
    expected = (logits[0, 2] - 2.0).item()
    assert processed[0, 2].item() == processed[1, 2].item() == expected
