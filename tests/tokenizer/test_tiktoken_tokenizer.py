"""TiktokenTokenizer gives tiktoken's own ids, and special tokens only when asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedserve.common.encoding import load_encoding
from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer
from pagedserve.server.tokenizer.tiktoken_tokenizer import TiktokenTokenizer

ENDOFTEXT = 100257
TEXTS = [
    "Hello, world!",
    " leading space",
    "你好世界 😀🚀 👍🏽 café",
    "before<|endoftext|>after <|fim_prefix|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_match_tiktoken(tiktoken_tokenizer: Tokenizer, text: str) -> None:
    encoding = load_encoding("cl100k_base")
    ids = tiktoken_tokenizer.encode(text)
    assert ids == encoding.encode_ordinary(text)
    assert tiktoken_tokenizer.decode(ids) == encoding.decode(ids) == text


def test_special_token_text_is_plain_text_unless_allowed(tiktoken_tokenizer: Tokenizer) -> None:
    text = "a<|endoftext|>b"
    assert ENDOFTEXT not in tiktoken_tokenizer.encode(text)
    allowed = tiktoken_tokenizer.encode(text, allowed_special={"<|endoftext|>"})
    assert allowed == load_encoding("cl100k_base").encode(text, allowed_special={"<|endoftext|>"})
    assert ENDOFTEXT in allowed


def test_allowing_an_unknown_special_token_is_an_error(tiktoken_tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError) as info:
        tiktoken_tokenizer.encode("x", allowed_special={"<|im_start|>"})
    assert info.value.param == "allowed_special"
    assert str(info.value) == (
        "allowed_special names ['<|im_start|>'], which are not special tokens of 'cl100k_base' "
        "(its special tokens: ['<|endofprompt|>', '<|endoftext|>', '<|fim_middle|>', "
        "'<|fim_prefix|>', '<|fim_suffix|>'])"
    )


def test_skip_special_tokens(tiktoken_tokenizer: Tokenizer) -> None:
    ids = [*tiktoken_tokenizer.encode("Hi"), ENDOFTEXT]
    assert tiktoken_tokenizer.decode(ids) == "Hi"
    assert tiktoken_tokenizer.decode(ids, skip_special_tokens=False) == "Hi<|endoftext|>"


def test_attributes(tiktoken_tokenizer: Tokenizer) -> None:
    assert tiktoken_tokenizer.name == "cl100k_base"
    assert tiktoken_tokenizer.vocab_size == 100277
    assert (tiktoken_tokenizer.bos_token_id, tiktoken_tokenizer.eos_token_id) == (None, ENDOFTEXT)
    assert tiktoken_tokenizer.all_special_ids == frozenset({100257, 100258, 100259, 100260,
                                                            100276})
    assert dict(tiktoken_tokenizer.special_tokens_map) == {"eos_token": "<|endoftext|>"}
    assert tiktoken_tokenizer.chat_template is None


# cl100k_base assigns no token to 100256 and 100261-100275, yet they are rows of a model's
# embedding (the embedded model has 100,277); ids past the encoding have no token either.
@pytest.mark.parametrize("token_id", [100256, 100261, 100275, 100277, 2**40])
def test_ids_without_a_token_decode_to_nothing(tiktoken_tokenizer: Tokenizer,
                                               token_id: int) -> None:
    hello, world = tiktoken_tokenizer.encode("Hello world")
    assert tiktoken_tokenizer.decode([hello, token_id, world]) == "Hello world"
    assert tiktoken_tokenizer.decode([token_id], skip_special_tokens=False) == ""
    assert tiktoken_tokenizer.token_bytes(token_id) == b""


def test_a_character_carries_on_across_an_id_without_a_token(
        tiktoken_tokenizer: Tokenizer) -> None:
    first, second = load_encoding("cl100k_base").encode("龘")[:2]
    assert tiktoken_tokenizer.decode([first, 100256, second]) == "龘"


def test_negative_ids_are_errors(tiktoken_tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError) as info:
        tiktoken_tokenizer.decode([9906, -1])
    assert (str(info.value), info.value.param) == ("token ids must be non-negative, got -1",
                                                   "token_ids")
    with pytest.raises(InvalidRequestError):
        tiktoken_tokenizer.token_bytes(-1)


def test_bos_token_and_chat_template_from_the_spec(tmp_path: Path) -> None:
    spec = {"encoding": "cl100k_base", "eos_token": "<|endoftext|>",
            "bos_token": "<|endofprompt|>", "chat_template": "{{ messages[0]['content'] }}"}
    (tmp_path / "tiktoken.json").write_text(json.dumps(spec))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("Hi") == [100276, 13347]
    assert tokenizer.encode("Hi", add_special_tokens=False) == [13347]
    assert tokenizer.apply_chat_template([{"role": "user", "content": "yo"}]) == "yo"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"encoding": "cl100k_base", "eos": "x"},
         "unknown keys ['eos']; allowed keys: ['bos_token', 'chat_template', 'encoding', "
         "'eos_token']"),
        ({"eos_token": "<|endoftext|>"}, "'encoding' must name a tiktoken encoding, got None"),
        ({"encoding": "cl100k_base", "eos_token": 7}, "'eos_token' must be a string, got 7"),
        ({"encoding": "cl100k_base", "eos_token": "</s>"},
         "'</s>' is not a special token of tiktoken encoding 'cl100k_base' (its special "
         "tokens: ['<|endofprompt|>', '<|endoftext|>', '<|fim_middle|>', '<|fim_prefix|>', "
         "'<|fim_suffix|>'])"),
        ({"encoding": "no_such_encoding"}, "unknown tiktoken encoding 'no_such_encoding': "),
    ],
)
def test_bad_spec_is_a_load_error(tmp_path: Path, spec: dict[str, object], error: str) -> None:
    (tmp_path / "tiktoken.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerLoadError) as info:
        TiktokenTokenizer.from_dir(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'tiktoken.json'}: {error}")
