from __future__ import annotations

import pytest

from pagedserve.client import AsyncClient, CallableCounter, ServerTokenCounter, TiktokenCounter
from pagedserve.client.api.client_errors import InvalidRequestError
from pagedserve.client.budget.tokens import PromptCount, reserved_tokens
from pagedserve.common.encoding import load_encoding

TEXTS = [
    "",
    "hello world",
    "The paged KV cache <|endoftext|> keeps blocks",
    "  spaces\n\nand 数字 123",
]


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.mark.parametrize("text", TEXTS)
def test_text_counts_equal_tiktoken(counter, text):
    encoding = load_encoding("cl100k_base")
    assert counter.count_text(text) == len(encoding.encode(text, disallowed_special=()))


def test_prompt_forms(counter):
    encoding = load_encoding("cl100k_base")
    n = [len(encoding.encode_ordinary(t)) for t in TEXTS[1:3]]
    assert counter.count_prompt(TEXTS[1]) == n[0]
    assert counter.count_prompt(TEXTS[1:3]) == n[0] + n[1]
    assert counter.count_prompt([1, 2, 3]) == 3
    assert counter.count_prompt([[1, 2], [3]]) == 3


def test_chat_overhead_as_documented(counter):
    encoding = load_encoding("cl100k_base")

    def n(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "name": "ada", "content": "Count me."},
        {"role": "user", "content": [{"type": "text", "text": "part one "},
                                     {"type": "image_url", "image_url": {"url": "x"}},
                                     {"type": "text", "text": "part two"}]},
    ]
    expected = (
        3
        + 3 + n("system") + n("You are terse.")
        + 3 + n("user") + n("ada") + 1 + n("Count me.")
        + 3 + n("user") + n("part one part two")
    )
    assert counter.count_messages(messages) == expected


async def test_count_dispatches_on_kind(counter):
    assert await counter.count("completions", {"prompt": "hello world"}) == PromptCount(2)
    chat = {"messages": [{"role": "user", "content": "hello world"}]}
    assert await counter.count("chat", chat) == PromptCount(3 + 3 + 1 + 2)
    # A Responses API body counts as the chat messages it makes: instructions first.
    assert await counter.count("responses", {"input": "hello world"}) == PromptCount(
        3 + 3 + 1 + 2)
    response = {"instructions": "hello", "input": [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "hello world"}]}]}
    assert await counter.count("responses", response) == PromptCount(
        3 + (3 + 1 + 1) + (3 + 1 + 2))
    with pytest.raises(InvalidRequestError) as info:
        await counter.count("responses", {"input": []})
    assert str(info.value) == "input must be a string or a non-empty list of messages, got []"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": 5}, "prompt must be a string, a list of token ids, or a non-empty list of "
                        "either, got 5"),
        ({"prompt": []}, "prompt must be a string, a list of token ids, or a non-empty list of "
                         "either, got []"),
    ],
)
async def test_bad_prompt(counter, body, message):
    with pytest.raises(InvalidRequestError) as info:
        await counter.count("completions", body)
    assert str(info.value) == message


async def test_bad_messages(counter):
    with pytest.raises(InvalidRequestError) as info:
        await counter.count("chat", {"messages": []})
    assert str(info.value) == "messages must be a non-empty list of message objects, got []"


@pytest.mark.parametrize(
    ("kind", "body", "count", "expected"),
    [
        ("completions", {"prompt": "x", "max_tokens": 10}, PromptCount(5), 15),
        ("completions", {"prompt": "x"}, PromptCount(5), 5 + 16),
        ("completions", {"prompt": "x", "max_tokens": 10, "n": 3}, PromptCount(5), 35),
        ("completions", {"prompt": "x", "max_tokens": 10, "n": 2, "best_of": 4},
         PromptCount(5), 45),
        ("completions", {"prompt": ["a", "b"], "max_tokens": 10}, PromptCount(4), 24),
        ("chat", {"max_tokens": 7}, PromptCount(9), 16),
        ("chat", {"max_completion_tokens": 7, "max_tokens": 100}, PromptCount(9), 16),
        ("chat", {}, PromptCount(9), 9 + 1000),
        ("chat", {}, PromptCount(9, max_model_len=512), 512),
        ("responses", {"max_output_tokens": 7, "max_tokens": 100}, PromptCount(9), 16),
        ("responses", {}, PromptCount(9, max_model_len=512), 512),
    ],
)
def test_reserved_tokens(kind, body, count, expected):
    assert reserved_tokens(kind, body, count, default_max_tokens=1000) == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": -1}, "max_tokens must be a non-negative integer, got -1"),
        ({"max_tokens": "10"}, "max_tokens must be a non-negative integer, got '10'"),
        ({"n": 1.5}, "n must be a non-negative integer, got 1.5"),
    ],
)
def test_reserved_tokens_rejects_bad_params(body, message):
    with pytest.raises(InvalidRequestError) as info:
        reserved_tokens("chat", body, PromptCount(1), 10)
    assert str(info.value) == message


async def test_server_counter_uses_tokenize(serve):
    server, url = await serve(max_model_len=4096)
    async with AsyncClient(url) as client:
        counter = ServerTokenCounter(client, model="fallback")
        assert await counter.count("completions", {"prompt": "hello world"}) == PromptCount(
            2, 4096
        )
        chat = {"model": "m", "messages": [{"role": "user", "content": "hello world"}]}
        assert await counter.count("chat", chat) == PromptCount(2 + 7, 4096)
        assert await counter.count("completions", {"prompt": [1, 2, 3]}) == PromptCount(3)
    assert server.tokenize_bodies == [
        {"model": "fallback", "prompt": "hello world"},
        {"model": "m", "messages": [{"role": "user", "content": "hello world"}]},
    ]


async def test_callable_counter_sync_and_async():
    assert await CallableCounter(lambda kind, body: 7).count("chat", {}) == PromptCount(7)

    async def count(kind, body):
        return len(body["prompt"])

    assert await CallableCounter(count).count("completions", {"prompt": "abcd"}) == PromptCount(4)
    with pytest.raises(InvalidRequestError) as info:
        await CallableCounter(lambda kind, body: -2).count("chat", {})
    assert str(info.value) == "token count must be a non-negative int, got -2"
