"""A request's beam-search state as the engine sets it up (``BeamState.for_request``)."""

from __future__ import annotations

from pagedserve.common.sampling_params import BeamSearchParams, SamplingParams
from pagedserve.server.engine.core.beam_search import BeamState


def test_only_a_beam_search_request_gets_a_state() -> None:
    assert BeamState.for_request(SamplingParams(max_tokens=4), eos_token_id=2, room=10) is None


def test_the_state_ends_on_eos_within_the_room_the_context_leaves() -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=0.5)
    state = BeamState.for_request(params.to_sampling_params(), eos_token_id=2, room=6)
    assert state is not None
    assert (state.width, state.length_penalty, state.max_tokens, state.eos_token_ids) == (
        3, 0.5, 6, frozenset([2]))
    roomy = BeamState.for_request(params.to_sampling_params(), eos_token_id=2, room=50)
    assert roomy is not None and roomy.max_tokens == 8


def test_ignore_eos_or_no_end_token_means_no_ending_token() -> None:
    ignoring = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    plain = BeamSearchParams(beam_width=2, max_tokens=4)
    for state in (BeamState.for_request(ignoring.to_sampling_params(), 2, room=10),
                  BeamState.for_request(plain.to_sampling_params(), None, room=10)):
        assert state is not None and state.eos_token_ids == frozenset()
