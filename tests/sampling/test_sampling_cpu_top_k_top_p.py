"""The C top-k / top-p of the CPU backend: the same tokens masked as the sort in
``warpers.apply_top_k_top_p`` and as transformers' warpers, on rows with ties, -inf, every
kind of k and p and odd widths; the torch path for NaN, +inf and other dtypes; and in the
sampler, the same processed logits and draws as without it."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.kernels import cpu_sampling, native_build
from pagedserve.kernels.dispatch import get_kernel_ops
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow
from pagedserve.server.sampling.warpers import apply_top_k_top_p

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")


def _assert_same(got: torch.Tensor | None, expected: torch.Tensor) -> None:
    assert got is not None
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[torch.isfinite(expected)], expected[torch.isfinite(expected)])


def _row_cases(width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, width, generator=generator) * 4
    logits[1] = logits[1].round()  # many ties
    logits[2, ::3] = float("-inf")
    logits[3] = 2.0  # one value everywhere
    logits[4, : width // 2] = float("-inf")
    logits[5] = torch.linspace(-30, 30, width)
    logits[6, 0] = 1e4  # one token dominates; the rest spread far below
    top_k = torch.randint(1, width + 1, (12,), generator=generator)
    top_k[::3] = width
    top_p = torch.rand(12, generator=generator).clamp(0.02, 1.0)
    top_p[1::4] = 1.0
    top_p[2] = 1e-6  # only the largest survives
    return logits, top_k, top_p


@pytest.mark.parametrize("width", [1, 7, 64, 1000, 8192])
@pytest.mark.parametrize("which", ["top_k", "top_p", "both"])
def test_masks_what_the_sort_masks(width, which):
    for seed in range(4):
        logits, top_k, top_p = _row_cases(width, seed)
        k = top_k if which != "top_p" else None
        p = top_p if which != "top_k" else None
        _assert_same(cpu_sampling.top_k_top_p(logits, k, p), apply_top_k_top_p(logits, k, p))


@pytest.mark.parametrize(("k", "p"), [(5, None), (None, 0.8), (20, 0.9), (1, None), (None, 0.3)])
def test_matches_transformers_warpers(k, p):
    logits = torch.randn(1, 512, generator=torch.Generator().manual_seed(k or 0)) * 3
    expected = logits.clone()
    if k is not None:
        expected = TopKLogitsWarper(k)(None, expected)
    if p is not None:
        expected = TopPLogitsWarper(p)(None, expected)
    got = cpu_sampling.top_k_top_p(logits, None if k is None else torch.tensor([k]),
                                   None if p is None else torch.tensor([p]))
    _assert_same(got, expected)


def test_top_p_ties_keep_the_highest_ids_first():
    logits = torch.zeros(1, 8192)
    logits[0, 1::2] = 1.0
    got = cpu_sampling.top_k_top_p(logits, None, torch.tensor([0.5]))
    kept = torch.isfinite(got[0]).nonzero().squeeze(1).tolist()
    assert kept == list(range(8191 - 2 * (len(kept) - 1), 8192, 2))
    _assert_same(got, apply_top_k_top_p(logits, None, torch.tensor([0.5])))


def test_a_tiny_top_p_keeps_the_last_of_the_largest():
    logits = torch.tensor([[3.0, 1.0, 3.0, -2.0, 3.0, 0.5]])
    got = cpu_sampling.top_k_top_p(logits, None, torch.tensor([1e-7]))
    assert torch.isfinite(got[0]).nonzero().squeeze(1).tolist() == [4]


def test_rows_already_masked_stay_as_they_are():
    logits = torch.full((2, 16), float("-inf"))
    got = cpu_sampling.top_k_top_p(logits, torch.tensor([3, 16]), torch.tensor([0.5, 0.9]))
    assert torch.equal(got, logits)
    assert got.data_ptr() != logits.data_ptr()  # a new tensor; the input is left alone


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_nan_and_positive_infinity_leave_it_to_the_sort(poison):
    logits = torch.randn(3, 100)
    logits[1, 7] = poison
    assert cpu_sampling.top_k_top_p(logits, torch.tensor([5, 5, 5]), None) is None


def test_other_dtypes_and_shapes_leave_it_to_the_sort():
    logits = torch.randn(3, 100)
    assert cpu_sampling.top_k_top_p(logits.to(torch.bfloat16), None, torch.ones(3)) is None
    assert cpu_sampling.top_k_top_p(logits[0], None, torch.ones(1)) is None
    assert cpu_sampling.top_k_top_p(torch.empty(3, 0), None, torch.ones(3)) is None


def test_threads_do_not_change_the_answer():
    logits, top_k, top_p = _row_cases(4096, seed=9)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_sampling.top_k_top_p(logits, top_k, top_p)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, cpu_sampling.top_k_top_p(logits, top_k, top_p))


def _rows() -> list[SamplingRow]:
    return [SamplingRow(SamplingParams(temperature=0.8, top_p=0.9), [1], [2]),
            SamplingRow(SamplingParams(temperature=1.0, top_k=7), [3], [], seed=4),
            SamplingRow(SamplingParams(temperature=0.0), [5], []),
            SamplingRow(SamplingParams(temperature=1.2, top_k=40, top_p=0.7), [6], [7])]


def test_in_the_sampler_the_same_logits_and_draws_as_the_sort(monkeypatch):
    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(5)) * 2
    metadata = SamplingMetadata.build(_rows(), 256, "cpu")
    calls = []

    def spy(*args):
        calls.append(args)
        return cpu_sampling.top_k_top_p(*args)

    with_kernel = Sampler(seed=3, top_k_top_p=spy)
    without = Sampler(seed=3)
    _assert_same(with_kernel.process_logits(logits, metadata),
                 without.process_logits(logits, metadata))
    assert len(calls) == 1
    for _ in range(5):
        assert torch.equal(with_kernel(logits, metadata).sampled_token_ids,
                           without(logits, metadata).sampled_token_ids)


def test_the_cpu_backend_carries_it_and_the_torch_backend_does_not():
    assert get_kernel_ops("cpu", "cpu").top_k_top_p is cpu_sampling.top_k_top_p
    assert get_kernel_ops("cpu", "torch").top_k_top_p is None
