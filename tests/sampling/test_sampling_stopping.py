"""check_stop_token: EOS, stop token ids, max_tokens and min_tokens."""

from __future__ import annotations

import pytest

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import check_stop_token

EOS = 2


@pytest.mark.parametrize(
    ("params", "output_len", "token_id", "expected"),
    [
        (SamplingParams(max_tokens=5), 3, 10, (None, None)),
        (SamplingParams(max_tokens=5), 3, EOS, ("stop", None)),
        (SamplingParams(max_tokens=5, stop_token_ids=[7, 9]), 3, 9, ("stop", 9)),
        (SamplingParams(max_tokens=5), 5, 10, ("length", None)),
        # A stop token in the last allowed position is a stop, not a cut.
        (SamplingParams(max_tokens=5), 5, EOS, ("stop", None)),
        (SamplingParams(max_tokens=5, stop_token_ids=[7]), 5, 7, ("stop", 7)),
        (SamplingParams(max_tokens=5, ignore_eos=True), 3, EOS, (None, None)),
        (SamplingParams(max_tokens=5, ignore_eos=True), 5, EOS, ("length", None)),
        (SamplingParams(max_tokens=5, ignore_eos=True, stop_token_ids=[EOS]), 3, EOS,
         ("stop", EOS)),
        (SamplingParams(max_tokens=8, min_tokens=4, stop_token_ids=[7]), 3, EOS, (None, None)),
        (SamplingParams(max_tokens=8, min_tokens=4, stop_token_ids=[7]), 3, 7, (None, None)),
        (SamplingParams(max_tokens=8, min_tokens=4, stop_token_ids=[7]), 4, 7, ("stop", 7)),
        (SamplingParams(max_tokens=8, min_tokens=4), 4, EOS, ("stop", None)),
        (SamplingParams(max_tokens=4, min_tokens=4), 4, 10, ("length", None)),
        (SamplingParams(max_tokens=None), 100_000, 10, (None, None)),
    ],
)
def test_check_stop_token(
    params: SamplingParams, output_len: int, token_id: int, expected: tuple
) -> None:
    assert check_stop_token(params, output_len, token_id, EOS) == expected


def test_without_an_eos_token_only_stop_ids_and_length_stop() -> None:
    params = SamplingParams(max_tokens=3, stop_token_ids=[5])
    assert check_stop_token(params, 1, EOS, None) == (None, None)
    assert check_stop_token(params, 1, 5, None) == ("stop", 5)
    assert check_stop_token(params, 3, EOS, None) == ("length", None)
