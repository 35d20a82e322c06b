"""The C argmax of the CPU backend's greedy rows: torch.argmax's answer on every row,
including ties, NaN, all -inf, strided rows and odd widths; other dtypes fall back to torch;
and in the sampler, greedy rows (all greedy, or mixed with random ones) take it."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.kernels import cpu_sampling, native_build
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")


def _awkward_rows() -> torch.Tensor:
    logits = torch.randn(9, 1000, generator=torch.Generator().manual_seed(0))
    logits[0, [17, 400, 999]] = 50.0  # a tie: the first index wins
    logits[1, [600, 30]] = float("nan")  # the first NaN wins, as in torch
    logits[2] = float("-inf")  # every token masked
    logits[3] = 0.0
    logits[4, 999] = float("inf")
    logits[5, [0, 1]] = float("inf")
    logits[6, 0] = 1e30  # the first element is the largest
    logits[7, :] = float("-inf")
    logits[7, 998] = -1e30
    return logits


def test_matches_torch_on_awkward_rows():
    logits = _awkward_rows()
    out = cpu_sampling.argmax(logits)
    assert out.dtype == torch.int64
    assert out.tolist() == logits.argmax(dim=-1).tolist()
    assert out[:3].tolist() == [17, 30, 0]


@pytest.mark.parametrize("width", [1, 7, 16, 33, 8192])
def test_matches_torch_at_odd_widths_and_on_strided_rows(width):
    wide = torch.randn(5, width + 3, generator=torch.Generator().manual_seed(width))
    rows = wide[:, 1:width + 1]  # row stride larger than the width
    assert cpu_sampling.argmax(rows).tolist() == rows.argmax(dim=-1).tolist()


@pytest.mark.parametrize("width", [16, 37, 1000])
def test_ties_in_different_lanes_and_the_tail_take_the_first_index(width):
    """The largest value at several places (in different vector lanes, or in the tail after
    the last whole vector), and a NaN anywhere: torch's index every time."""
    rng = torch.Generator().manual_seed(width)
    for trial in range(200):
        row = torch.randint(-3, 3, (1, width), generator=rng).float()  # many ties already
        places = torch.randperm(width, generator=rng)[:1 + trial % 4]
        row[0, places] = 7.0
        if trial % 7 == 0:
            row[0, places[0]] = float("nan")
        assert cpu_sampling.argmax(row).tolist() == row.argmax(dim=-1).tolist(), places


def test_threads_do_not_change_the_answer():
    logits = torch.randn(64, 4096, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_sampling.argmax(logits)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, cpu_sampling.argmax(logits))
    assert torch.equal(one, logits.argmax(dim=-1))


def test_other_dtypes_and_shapes_take_torch():
    half = _awkward_rows().to(torch.bfloat16)
    assert cpu_sampling.argmax(half).tolist() == half.argmax(dim=-1).tolist()
    assert cpu_sampling.argmax(torch.empty(0, 10)).tolist() == []
    with pytest.raises(IndexError):
        cpu_sampling.argmax(torch.empty(3, 0))  # torch's own error for an empty row


def _rows(greedy_only: bool) -> list[SamplingRow]:
    greedy = SamplingParams(temperature=0.0)
    rows = [SamplingRow(greedy, [1], []), SamplingRow(greedy, [2], [3])]
    if not greedy_only:
        rows.insert(1, SamplingRow(SamplingParams(temperature=0.8), [4], [], seed=5))
    return rows


@pytest.mark.parametrize("greedy_only", [True, False])
def test_in_the_sampler_greedy_rows_take_the_c_argmax(greedy_only, monkeypatch):
    rows = _rows(greedy_only)
    logits = torch.randn(len(rows), 64, generator=torch.Generator().manual_seed(4))
    logits[0, [5, 9]] = 20.0  # a tie
    calls = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return cpu_sampling.argmax(x)

    metadata = SamplingMetadata.build(rows, 64, "cpu")
    c_path = Sampler(seed=0, cpu_argmax=counted)(logits, metadata).sampled_token_ids
    torch_path = Sampler(seed=0)(logits, metadata).sampled_token_ids
    assert calls == [(len(rows), 64)]
    assert c_path.tolist() == torch_path.tolist()
    assert c_path[0] == 5 and c_path[-1] == int(logits[-1].argmax())
