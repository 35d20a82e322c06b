"""Stop strings across deltas: nothing emitted is ever cut, the split never matters."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.sampling import StopChecker


def run(stop: Sequence[str], deltas: Sequence[str], include: bool = False
        ) -> tuple[list[str], str | None]:
    """Emitted pieces (the flush last, when nothing matched) and the stop string matched."""
    checker = StopChecker(stop, include)
    emitted = []
    for delta in deltas:
        text, matched = checker.feed(delta)
        emitted.append(text)
        if matched is not None:
            return emitted, matched
    return [*emitted, checker.flush()], None


def test_stop_split_across_deltas() -> None:
    assert run(["STOP"], ["Hello S", "TO", "P and more"]) == (["Hello ", "", ""], "STOP")
    assert run(["STOP"], ["Hello S", "TO", "P and more"], include=True) == (
        ["Hello ", "", "STOP"], "STOP")


def test_only_a_possible_start_is_held_back() -> None:
    # "ab" cannot begin "xyz", so it goes out at once; "x" could and waits.
    assert run(["xyz"], ["ab", "cx", "yw", "!"]) == (["ab", "c", "xyw", "!", ""], None)


def test_flush_releases_the_held_tail() -> None:
    checker = StopChecker(["</answer>"])
    assert checker.feed("42 </ans") == ("42 ", None)
    assert checker.flush() == "</ans"
    assert checker.flush() == ""


def test_first_completed_stop_wins() -> None:
    # "cd" completes before "abcde" would, even though "abcde" starts earlier.
    assert run(["abcde", "cd"], ["xabcdef"]) == (["xab"], "cd")
    assert run(["abcde", "cd"], ["xab", "c", "def"]) == (["x", "", "ab"], "cd")


def test_same_end_prefers_the_longer_stop() -> None:
    assert run(["c", "bc"], ["abcd"]) == (["a"], "bc")
    assert run(["c", "bc"], ["abcd"], include=True) == (["abc"], "bc")


def test_overlapping_prefixes() -> None:
    assert run(["aab"], ["a", "a", "a", "b", "z"]) == (["", "", "a", ""], "aab")
    assert run(["aab"], ["a", "a", "a", "c"]) == (["", "", "a", "aac", ""], None)


def test_stop_inside_one_delta_cuts_the_rest() -> None:
    assert run(["\n\n"], ["line one\n\nline two"]) == (["line one"], "\n\n")
    assert run(["\n\n"], ["line one\n\nline two"], include=True) == (["line one\n\n"], "\n\n")


def test_no_stop_strings_pass_everything_through() -> None:
    assert run([], ["a", "b"]) == (["a", "b", ""], None)


def test_feeding_after_a_match_is_an_error() -> None:
    checker = StopChecker(["x"])
    assert checker.feed("ax") == ("a", "x")
    assert checker.matched == "x"
    with pytest.raises(RuntimeError, match=r"^stop string 'x' already ended this sequence$"):
        checker.feed("more")


def test_fork_keeps_the_held_tail() -> None:
    parent = StopChecker(["END"])
    assert parent.feed("fin E") == ("fin ", None)
    child = parent.fork()
    assert child.feed("ND") == ("", "END")
    assert parent.feed("nd") == ("End", None)


@pytest.mark.parametrize(("stop", "error"), [
    (["ok", ""], "stop[1] must be a non-empty string, got ''"),
    ([None], "stop[0] must be a non-empty string, got None"),
])
def test_invalid_stop_strings(stop: list, error: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        StopChecker(stop)
    assert (str(info.value), info.value.param) == (error, "stop")


ALPHABET = "abc"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=24),
    stop=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 24), max_size=8),
    include=st.booleans(),
)
def test_any_split_gives_the_char_by_char_result(text: str, stop: list[str], cuts: list[int],
                                                 include: bool) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    chunks = [text[a:b] for a, b in pairwise(bounds)]
    emitted, matched = run(stop, chunks, include)
    by_char, by_char_matched = run(stop, list(text), include)
    assert ("".join(emitted), matched) == ("".join(by_char), by_char_matched)
    # The reference: the earliest position where some stop string has just completed.
    ends = [(i + len(s), -len(s), s) for s in stop for i in range(len(text)) if
            text.startswith(s, i)]
    if ends:
        end, neg_len, first = min(ends)
        cut = end if include else end + neg_len
        assert ("".join(emitted), matched) == (text[:cut], first)
    else:
        assert ("".join(emitted), matched) == (text, None)
