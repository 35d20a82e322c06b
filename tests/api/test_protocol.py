"""Request-body parsing, without a server: shapes accepted, and the exact 400 each misuse
gets."""

from __future__ import annotations

import pytest

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.chat import parse_chat_request
from pagedserve.server.api.protocol.completions import parse_completion_request
from pagedserve.server.api.protocol.tokenize import (
    parse_detokenize_request,
    parse_tokenize_request,
)


def completion(**fields: object) -> dict[str, object]:
    return {"model": "m", "prompt": "hi", **fields}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_prompt_shapes(prompt: object, expected: list[object]) -> None:
    assert parse_completion_request(completion(prompt=prompt)).prompts == expected


@pytest.mark.parametrize("prompt", [[], [[]], ["a", 1], [True], {"text": "x"}, 3])
def test_bad_prompt_shapes(prompt: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion_request(completion(prompt=prompt))
    assert info.value.param == "prompt"
    assert info.value.message.startswith(
        "prompt must be a string, a list of strings, a list of token ids or a list of "
        "token-id lists, got "
    )


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": "10"}, "max_tokens", 'max_tokens must be an integer, got "10"'),
        ({"max_tokens": True}, "max_tokens", "max_tokens must be an integer, got true"),
        ({"temperature": "hot"}, "temperature", 'temperature must be a number, got "hot"'),
        ({"stream": 1}, "stream", "stream must be a boolean, got 1"),
        ({"stop": [1]}, "stop", "stop must be a string or a list of strings, got [1]"),
        ({"seed": -1}, "seed", "seed must be at least 0, got -1"),
        ({"seed": 1.5}, "seed", "seed must be an integer, got 1.5"),
        ({"seed": -1e19}, "seed", "seed must be at least 0, got -1e+19"),
        ({"logit_bias": {"x": 1}}, "logit_bias",
         'logit_bias keys must be token ids (non-negative integers), got "x"'),
        ({"suffix": "end"}, "suffix", "suffix is not supported by this server"),
        ({"frobnicate": 1}, "frobnicate",
         "Unrecognized request argument supplied: frobnicate"),
        ({"stream_options": {"include_usage": True}}, "stream_options",
         "stream_options is only allowed when stream is true"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}},
         "stream_options.include_usage",
         'stream_options.include_usage must be a boolean, got "yes"'),
        ({"stream": True, "stream_options": {"extra": 1}}, "stream_options.extra",
         "Unrecognized request argument supplied: stream_options.extra"),
    ],
)
def test_completion_field_errors(fields: dict[str, object], param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion_request(completion(**fields))
    assert (info.value.param, info.value.message) == (param, message)


def test_model_is_required() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion_request({"prompt": "x"})
    assert (info.value.param, info.value.message) == ("model", "model is required")


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion_request([1, 2])
    assert info.value.message == "the request body must be a JSON object, got [1,2]"


def test_sampling_fields_pass_through() -> None:
    req = parse_completion_request(completion(
        temperature=0, top_p=0.5, n=2, stop="x", seed=7, logit_bias={"5": -100},
        top_k=3, min_p=0.1, repetition_penalty=1.1, ignore_eos=True, min_tokens=1,
        stop_token_ids=[2], best_of=3, include_stop_str_in_output=True,
        skip_special_tokens=False, user="u",
    ))
    assert req.sampling == {
        "temperature": 0.0, "top_p": 0.5, "n": 2, "stop": ["x"], "seed": 7,
        "logit_bias": {5: -100.0}, "top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1,
        "ignore_eos": True, "min_tokens": 1, "stop_token_ids": [2], "best_of": 3,
        "include_stop_str_in_output": True, "skip_special_tokens": False,
    }


def test_beam_search_defaults_to_temperature_zero() -> None:
    req = parse_completion_request(completion(use_beam_search=True, best_of=2))
    assert req.sampling == {"use_beam_search": True, "best_of": 2, "temperature": 0.0}


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    req = parse_chat_request(chat(max_tokens=5, max_completion_tokens=7))
    assert req.max_tokens == 7
    assert parse_chat_request(chat(max_tokens=5)).max_tokens == 5


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"messages": []}, "messages", "messages must be a non-empty list of messages, got []"),
        ({"messages": None}, "messages", "messages is required"),
        ({"top_logprobs": 2}, "top_logprobs", "top_logprobs requires logprobs to be true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs",
         "top_logprobs must be at most 20, got 21"),
        ({"tools": [{"type": "function"}]}, "tools[0].function",
         "tools[0].function is required"),
        ({"response_format": {"type": "structural_tag"}}, "response_format.type",
         'response_format.type "structural_tag" is not supported: use "text", "json_object" '
         'or "json_schema"'),
        ({"modalities": ["text", "audio"]}, "modalities",
         'modalities ["text","audio"] is not supported: only ["text"] is'),
    ],
)
def test_chat_field_errors(fields: dict[str, object], param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request(chat(**fields))
    assert (info.value.param, info.value.message) == (param, message)


def test_chat_accepts_text_response_format_and_ignored_fields() -> None:
    req = parse_chat_request(chat(response_format={"type": "text"}, user="u", store=False,
                                  metadata={"k": "v"}, logprobs=True, top_logprobs=3))
    assert (req.logprobs, req.top_logprobs) == (True, 3)


def test_tokenize_needs_exactly_one_input() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_tokenize_request({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert info.value.message == "give exactly one of prompt and messages"
    with pytest.raises(InvalidRequestError):
        parse_tokenize_request({"model": "m"})
    req = parse_tokenize_request({"prompt": "a"})
    assert (req.model, req.prompt, req.messages) == (None, "a", None)


def test_detokenize_rejects_negative_ids() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_detokenize_request({"tokens": [1, -2]})
    assert (info.value.param, info.value.message) == (
        "tokens", "tokens must be a list of non-negative token ids, got [1,-2]")
    assert parse_detokenize_request({"tokens": [4, 5]}).tokens == [4, 5]
