"""The C exponential race of the CPU backend: distributed as its probabilities, a zero
probability never wins, reproducible per seed and row whatever the rows around it; and in
the sampler, seeded rows draw exactly what the torch path draws, unseeded rows repeat under
the sampler's seed."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.kernels import cpu_sampling, native_build
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])


def test_frequencies_follow_the_probabilities():
    draws = torch.cat([cpu_sampling.exponential_race(PROBS.repeat(500, 1), seed)
                       for seed in range(40)])  # 20,000 draws
    frequencies = torch.bincount(draws, minlength=5).double() / draws.numel()
    # Binomial standard deviations are at most 0.0036 here; 5 of them.
    torch.testing.assert_close(frequencies, PROBS.double(), rtol=0, atol=0.018)
    assert frequencies[4] == 0  # a zero probability never wins


def test_a_zero_probability_never_wins_over_a_wide_vocabulary():
    """335M noise words, about 20 times the 2^24 words of a 24-bit uniform: every word a
    uniform can take occurs, the largest included, whose exponential must stay above 0 (a
    draw of 0 turns a masked token's 0/0 into a NaN that wins the argmax)."""
    probs = torch.zeros(256, 65536)
    probs[:, 7] = 0.75
    probs[:, 40000] = 0.25
    for seed in range(20):
        draws = cpu_sampling.exponential_race(probs, seed)
        assert ((draws == 7) | (draws == 40000)).all(), draws[(draws != 7) & (draws != 40000)]


def test_equal_probabilities_over_a_wide_row_favour_no_token():
    """51,200 draws from 256 equal probabilities: the counts pass a chi-square test (255
    degrees of freedom: mean 255, standard deviation 22.6; the bound is five of them above)."""
    draws = torch.cat([cpu_sampling.exponential_race(torch.full((512, 256), 1 / 256), seed)
                       for seed in range(100)])
    counts = torch.bincount(draws, minlength=256).double()
    expected = draws.numel() / 256
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 255 + 5 * 22.6, chi_square


def test_a_row_draws_from_its_seed_and_index_alone():
    probs = torch.softmax(torch.randn(6, 1000, generator=torch.Generator().manual_seed(0)), -1)
    first = cpu_sampling.exponential_race(probs, 123)
    assert torch.equal(first, cpu_sampling.exponential_race(probs, 123))
    assert torch.equal(cpu_sampling.exponential_race(probs[:3].clone(), 123), first[:3])
    different = [cpu_sampling.exponential_race(probs, seed) for seed in range(124, 134)]
    assert any(not torch.equal(first, other) for other in different)
    assert first.dtype == torch.int64 and ((first >= 0) & (first < 1000)).all()


def test_a_one_hot_row_always_draws_its_token():
    probs = torch.zeros(8, 300)
    probs[torch.arange(8), torch.arange(8) * 37] = 1.0
    for seed in range(5):
        assert cpu_sampling.exponential_race(probs, seed).tolist() == [i * 37 for i in range(8)]


def test_threads_do_not_change_the_draw():
    probs = torch.softmax(torch.randn(64, 2048, generator=torch.Generator().manual_seed(1)), -1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_sampling.exponential_race(probs, 9)
        torch.set_num_threads(2)
        two = cpu_sampling.exponential_race(probs, 9)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="expected float32 CPU probabilities"):
        cpu_sampling.exponential_race(PROBS.double()[None], 0)
    with pytest.raises(ValueError, match="expected float32 CPU probabilities"):
        cpu_sampling.exponential_race(PROBS, 0)


def _rows() -> list[SamplingRow]:
    params = SamplingParams(temperature=0.8, top_p=0.9)
    return [SamplingRow(params, [1], [2], seed=None), SamplingRow(params, [3], [4], seed=17),
            SamplingRow(SamplingParams(temperature=0.0), [5], []),
            SamplingRow(params, [6], [7, 8], seed=None)]


def _sample(sampler: Sampler, logits: torch.Tensor) -> list[int]:
    metadata = SamplingMetadata.build(_rows(), logits.size(1), "cpu")
    return sampler(logits, metadata).sampled_token_ids.tolist()


def test_in_the_sampler_seeded_and_greedy_rows_are_the_torch_paths():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    for sampler_seed in range(10):
        torch_path = _sample(Sampler(seed=sampler_seed), logits)
        c_path = _sample(Sampler(seed=sampler_seed, cpu_race=cpu_sampling.exponential_race),
                         logits)
        assert c_path[1] == torch_path[1]  # seeded
        assert c_path[2] == torch_path[2] == int(logits[2].argmax())  # greedy
        again = _sample(Sampler(seed=sampler_seed, cpu_race=cpu_sampling.exponential_race),
                        logits)
        assert again == c_path  # unseeded rows repeat under the sampler's seed
