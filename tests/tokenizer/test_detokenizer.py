"""Streaming detokenization: whole characters only, and the deltas join to the full decode."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.server.tokenizer import IncrementalDetokenizer, Tokenizer

HF_VOCAB = 384
TIKTOKEN_IDS = st.one_of(
    st.integers(0, 100255),  # the ordinary tokens
    st.sampled_from([100257, 100258, 100259, 100260, 100276]),  # the special ones
)
SPLIT_TEXT = st.text(alphabet=list("你好世界龘😀🚀👍🏽éaZ €∞\n "), max_size=20)


def stream(tokenizer: Tokenizer, ids: Sequence[int], cuts: Sequence[int],
           skip_special_tokens: bool = True) -> list[str]:
    """Deltas of ``ids`` fed in chunks split at ``cuts``, then the flush."""
    detokenizer = IncrementalDetokenizer(tokenizer, [1, 263], skip_special_tokens)
    bounds = sorted({0, len(ids), *(c for c in cuts if c < len(ids))})
    deltas = [detokenizer.add_tokens(ids[a:b]) for a, b in pairwise(bounds)]
    return [*deltas, detokenizer.flush()]


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(0, HF_VOCAB - 1), max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=10), skip=st.booleans())
def test_hf_random_ids_join_to_the_full_decode(hf_tokenizer: Tokenizer, ids: list[int],
                                               cuts: list[int], skip: bool) -> None:
    deltas = stream(hf_tokenizer, ids, cuts, skip)
    assert "".join(deltas) == hf_tokenizer.decode(ids, skip_special_tokens=skip)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(TIKTOKEN_IDS, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=10),
       skip=st.booleans())
def test_tiktoken_random_ids_join_to_the_full_decode(tiktoken_tokenizer: Tokenizer,
                                                     ids: list[int], cuts: list[int],
                                                     skip: bool) -> None:
    deltas = stream(tiktoken_tokenizer, ids, cuts, skip)
    assert "".join(deltas) == tiktoken_tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.fixture(scope="module", params=["hf_tokenizer", "tiktoken_tokenizer"])
def any_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return request.getfixturevalue(request.param)


@settings(max_examples=60, deadline=None)
@given(text=SPLIT_TEXT)
def test_split_characters_never_stream_as_replacement_chars(any_tokenizer: Tokenizer,
                                                            text: str) -> None:
    tokenizer = any_tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(tokenizer, ids, cuts=range(len(ids)))
    assert not any("\ufffd" in delta for delta in deltas)
    assert "".join(deltas) == text


def test_hf_character_split_over_three_tokens(hf_tokenizer: Tokenizer) -> None:
    ids = hf_tokenizer.encode("a龘😀", add_special_tokens=False)
    assert ids == [70, 171, 128, 252, 319, 252, 228]  # 龘 and 😀 are split into byte pieces
    assert stream(hf_tokenizer, ids, cuts=range(len(ids))) == ["a", "", "", "龘", "", "", "😀", ""]


def test_tiktoken_emoji_split_over_tokens(tiktoken_tokenizer: Tokenizer) -> None:
    ids = tiktoken_tokenizer.encode("🚀 rocket")
    assert ids == [9468, 248, 222, 25294]
    assert stream(tiktoken_tokenizer, ids, cuts=range(4)) == ["", "", "🚀", " rocket", ""]


def test_special_tokens_skipped_or_kept(hf_tokenizer: Tokenizer) -> None:
    ids = [4, *hf_tokenizer.encode("hi", add_special_tokens=False), 2]
    assert "".join(stream(hf_tokenizer, ids, cuts=[1, 2])) == "hi"
    assert "".join(stream(hf_tokenizer, ids, cuts=[1, 2], skip_special_tokens=False)) == (
        "<|im_start|>hi</s>")


def test_flush_renders_an_unfinished_character(hf_tokenizer: Tokenizer) -> None:
    detokenizer = IncrementalDetokenizer(hf_tokenizer, [1])
    assert detokenizer.add_tokens([70, 171, 128]) == "a"  # 'a' and two of 龘's three bytes
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.flush() == ""
    assert hf_tokenizer.decode([70, 171, 128]) == "a\ufffd"


def test_fork_continues_independently(hf_tokenizer: Tokenizer) -> None:
    parent = IncrementalDetokenizer(hf_tokenizer, [1])
    assert parent.add_tokens([171, 128]) == ""
    child = parent.fork()
    assert child.add_tokens([252]) == "龘"
    assert parent.add_tokens([70]) == "\ufffda"
    assert child.flush() == ""


def test_ids_without_a_token_add_nothing_and_characters_carry_on(
        hf_tokenizer: Tokenizer, auto_tokenizer: Any) -> None:
    detokenizer = IncrementalDetokenizer(hf_tokenizer, [1])
    assert detokenizer.add_tokens([70, HF_VOCAB]) == "a"
    assert detokenizer.add_tokens([171, 128, HF_VOCAB + 7]) == ""
    assert detokenizer.add_tokens([252]) == "龘"
    assert detokenizer.flush() == ""
    assert auto_tokenizer.decode([70, HF_VOCAB, 171, 128, HF_VOCAB + 7, 252]) == "a龘"


def test_tiktoken_unassigned_ids_add_nothing(tiktoken_tokenizer: Tokenizer) -> None:
    ids = tiktoken_tokenizer.encode("Hello, 龘 world")
    with_gaps = [100256, *ids[:3], 100261, *ids[3:], 100275]
    assert "".join(stream(tiktoken_tokenizer, with_gaps, [1, 4, 5])) == "Hello, 龘 world"
