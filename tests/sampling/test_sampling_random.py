"""Random draws: reproducible per seed whatever the batch, distributed as the softmax."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow
from pagedserve.server.sampling.exponential_race import exponential_noise, generator_seed

VOCAB = 32


def _flat_logits(rows: int) -> torch.Tensor:
    # Nearly uniform, so that a seed is the only thing that decides the token.
    return torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)).mul(0.1).repeat(
        rows, 1
    )


def _sample(rows: list[SamplingRow], logits: torch.Tensor, sampler_seed: int = 0) -> list[int]:
    metadata = SamplingMetadata.build(rows, logits.size(1), "cpu")
    return Sampler(seed=sampler_seed)(logits, metadata).sampled_token_ids.tolist()


def test_seeded_token_does_not_depend_on_the_batch_around_it() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95)
    others = [
        SamplingRow(SamplingParams(temperature=0.0), [1, 2], [3]),
        SamplingRow(SamplingParams(temperature=0.7, top_k=4), [5], [], seed=None),
        SamplingRow(SamplingParams(temperature=1.2, min_p=0.2), [6], [7, 8], seed=99),
    ]
    for seed in range(20):
        target = SamplingRow(params, [4, 4], [9, 10, 11], seed=seed)
        alone = _sample([target], _flat_logits(1), sampler_seed=1)
        batched = _sample([*others[:2], target, others[2]], _flat_logits(4), sampler_seed=2)
        assert batched[2] == alone[0]


def test_n_samples_with_consecutive_seeds_equal_separate_requests() -> None:
    params = SamplingParams(n=3, temperature=0.9, seed=40)
    together = [SamplingRow(params, [1], [2], seed=40 + i) for i in range(3)]
    separate = [
        _sample([SamplingRow(SamplingParams(temperature=0.9, seed=40 + i), [1], [2],
                             seed=40 + i)], _flat_logits(1))[0]
        for i in range(3)
    ]
    assert _sample(together, _flat_logits(3)) == separate


def test_recomputing_a_position_redraws_the_same_token() -> None:
    # After preemption the same sequence reaches the same output position again, possibly
    # with a different sampler state for unseeded rows.
    params = SamplingParams(temperature=1.0)
    rows = [SamplingRow(params, [1], list(range(position)), seed=7) for position in range(16)]
    first = _sample(rows, _flat_logits(16), sampler_seed=3)
    again = [_sample([row], _flat_logits(1), sampler_seed=4)[0] for row in rows]
    assert first == again


def test_different_seeds_and_positions_give_different_tokens() -> None:
    params = SamplingParams(temperature=1.0)
    by_seed = _sample([SamplingRow(params, [1], [], seed=s) for s in range(64)], _flat_logits(64))
    by_position = _sample(
        [SamplingRow(params, [1], [0] * p, seed=5) for p in range(64)], _flat_logits(64)
    )
    # 64 draws from 32 nearly equal tokens hit about 28 distinct ones; a broken seed gives 1.
    assert len(set(by_seed)) >= 20
    assert len(set(by_position)) >= 20
    # seed s + 1 at position p must not replay seed s at position p + 1.
    shifted = [generator_seed(s + 1, p) == generator_seed(s, p + 1)
               for s in range(50) for p in range(50)]
    assert not any(shifted)


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, -1), (2.0, 3)])
def test_seeded_draws_follow_the_processed_softmax(temperature: float, top_k: int) -> None:
    draws = 2000
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=temperature, top_k=top_k)
    rows = [SamplingRow(params, [0], [], seed=s) for s in range(draws)]
    tokens = torch.tensor(_sample(rows, logits.repeat(draws, 1)))
    observed = torch.bincount(tokens, minlength=6).float() / draws
    expected = (logits[0] / temperature).softmax(-1)
    if top_k != -1:
        expected[top_k:] = 0.0
        expected /= expected.sum()
    # About 3.5 standard errors of a frequency near 0.5 over 2000 draws.
    assert (observed - expected).abs().max().item() < 0.04
    assert observed[expected == 0].sum().item() == 0.0


def test_unseeded_draws_follow_the_softmax_too() -> None:
    draws = 2000
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    rows = [SamplingRow(SamplingParams(temperature=1.0), [0], []) for _ in range(draws)]
    tokens = torch.tensor(_sample(rows, logits.repeat(draws, 1), sampler_seed=8))
    observed = torch.bincount(tokens, minlength=4).float() / draws
    assert (observed - logits[0].softmax(-1)).abs().max().item() < 0.04


def test_temperature_zero_is_greedy_and_ties_go_to_the_lowest_id() -> None:
    logits = torch.tensor([[0.0, 5.0, 5.0, 1.0], [3.0, 2.0, 3.0, 0.0]])
    params = SamplingParams(temperature=0.0, top_k=2, top_p=0.5, seed=3)
    rows = [SamplingRow(params, [0], [], seed=3), SamplingRow(params, [0], [], seed=4)]
    assert _sample(rows, logits, sampler_seed=1) == [1, 0]
    assert _sample(rows, logits, sampler_seed=2) == [1, 0]


def test_top_k_one_is_greedy_even_with_random_noise() -> None:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(2))
    rows = [SamplingRow(SamplingParams(temperature=1.5, top_k=1), [0], [], seed=s)
            for s in range(8)]
    assert _sample(rows, logits) == logits.argmax(-1).tolist()


def test_top_k_beyond_the_vocabulary_is_clamped() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    rows = [
        SamplingRow(SamplingParams(temperature=1.0, top_k=VOCAB + 100), [0], [], seed=1),
        SamplingRow(SamplingParams(temperature=1.0, top_k=2), [0], [], seed=1),
    ]
    metadata = SamplingMetadata.build(rows, VOCAB, "cpu")
    assert metadata.top_k.tolist() == [VOCAB, 2]
    processed = Sampler(seed=0).process_logits(logits, metadata)
    assert torch.isfinite(processed[0]).all()
    assert torch.isfinite(processed[1]).sum().item() == 2
    alone = SamplingMetadata.build(rows[:1], VOCAB, "cpu")
    assert alone.top_k is None


def test_mixed_batch_processes_each_row_as_if_alone() -> None:
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=1.3), [1, 2], [2]),
        SamplingRow(SamplingParams(temperature=0.8, top_k=5), [3], [4], seed=11),
        SamplingRow(SamplingParams(temperature=1.1, top_p=0.7), [5], []),
        SamplingRow(SamplingParams(temperature=0.9, min_p=0.3, logit_bias={0: 2.0}), [6], []),
        SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=[7, 8, 9]), [7], []),
    ]
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(6))
    metadata = SamplingMetadata.build(rows, VOCAB, "cpu")
    sampler = Sampler(seed=0)
    batched = sampler.process_logits(logits, metadata)
    tokens = sampler(logits, metadata).sampled_token_ids
    for i, row in enumerate(rows):
        alone_metadata = SamplingMetadata.build([row], VOCAB, "cpu")
        alone = Sampler(seed=5).process_logits(logits[i : i + 1], alone_metadata)[0]
        assert torch.equal(batched[i], alone)
        assert torch.isfinite(alone[tokens[i]])
    # Greedy and seeded rows also agree on the token itself.
    for i in (0, 1, 4):
        alone_metadata = SamplingMetadata.build([rows[i]], VOCAB, "cpu")
        alone_token = Sampler(seed=9)(logits[i : i + 1], alone_metadata).sampled_token_ids
        assert alone_token.tolist() == [tokens[i].item()]


def test_a_top_p_of_one_leaves_its_row_untouched_beside_a_truncating_row() -> None:
    # exp(-200) underflows to probability 0; only a row that asked for top-p may drop it.
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = -200.0
    rows = [
        SamplingRow(SamplingParams(temperature=1.0, top_p=0.5), [0], [], seed=1),
        SamplingRow(SamplingParams(temperature=1.0, top_p=1.0), [0], [], seed=1),
    ]
    processed = Sampler(seed=0).process_logits(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))
    assert torch.isinf(processed[0, 5])
    assert torch.equal(processed[1], logits[1])


def test_min_p_of_one_keeps_only_the_top_tokens() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [0.0, 1.0, 2.0, 0.5]])
    params = SamplingParams(temperature=1.0, min_p=1.0)
    rows = [SamplingRow(params, [0], [], seed=s) for s in range(2)]
    processed = Sampler(seed=0).process_logits(logits, SamplingMetadata.build(rows, 4, "cpu"))
    assert torch.isfinite(processed).tolist() == [[False, True, False, True],
                                                  [False, False, True, False]]


def test_shared_cpu_noise_is_standard_exponential_and_never_zero() -> None:
    generator = torch.Generator().manual_seed(3)
    noise = exponential_noise((200, 1000), torch.device("cpu"), [], generator)
    assert noise.min().item() > 0.0
    # Exp(1): mean 1, variance 1, P(E > t) = exp(-t); 200k draws put each within ~1%.
    assert abs(noise.mean().item() - 1.0) < 0.01
    assert abs(noise.var().item() - 1.0) < 0.02
    for t in (0.1, 1.0, 3.0):
        tail = (noise > t).float().mean().item()
        assert abs(tail - torch.exp(torch.tensor(-t)).item()) < 0.005
