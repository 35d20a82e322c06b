"""HFTokenizer encodes and decodes exactly as transformers' AutoTokenizer on the same directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer
from pagedserve.server.tokenizer.hf import HFTokenizer
from tests.tokenizer_files import write_hf_tokenizer

TEXTS = [
    "Hello, world!",
    " leading space and trailing space ",
    "  two  spaces\n\nand\ttabs",
    "PagedAttention stores keys and values in blocks.",
    "你好世界，今天天气很好。",
    "Emoji 😀🚀 and skin tone 👍🏽, rare CJK 龘",
    "café naïve Straße ¿Dónde? € ≠ ∞",
    "<s>special</s> inside <|im_start|>user\nhi<|im_end|> text",
    "<unk><pad><s>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(hf_tokenizer: Tokenizer, auto_tokenizer: object,
                                     text: str, add_special_tokens: bool) -> None:
    expected = auto_tokenizer.encode(text, add_special_tokens=add_special_tokens)
    assert hf_tokenizer.encode(text, add_special_tokens=add_special_tokens) == expected


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(hf_tokenizer: Tokenizer, auto_tokenizer: object,
                                     text: str, skip_special_tokens: bool) -> None:
    ids = [*hf_tokenizer.encode(text), 2, 4, 5, 0, 3]
    expected = auto_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == expected


def test_special_tokens_and_sizes(hf_tokenizer: Tokenizer) -> None:
    assert hf_tokenizer.name == "hf0"
    assert hf_tokenizer.vocab_size == 384
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (1, 2)
    assert hf_tokenizer.all_special_ids == frozenset(range(6))
    assert dict(hf_tokenizer.special_tokens_map) == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    }
    assert hf_tokenizer.strips_leading_space is False
    assert hf_tokenizer.encode("<|im_start|>") == [1, 4]
    assert hf_tokenizer.decode([1, 4, 5, 2], skip_special_tokens=False) == (
        "<s><|im_start|><|im_end|></s>"
    )


@pytest.mark.parametrize("add_bos_token", [True, False])
def test_bos_follows_tokenizer_json_like_transformers(
    tmp_path: Path, auto_tokenizer_for: Callable[[Path], object], add_bos_token: bool,
) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300, add_bos_token=add_bos_token)
    ours, reference = load_tokenizer(model_dir), auto_tokenizer_for(model_dir)
    body = ours.encode("hello world", add_special_tokens=False)
    assert ours.encode("hello world") == [1, *body] if add_bos_token else body
    assert ours.encode("hello world") == reference.encode("hello world")


def test_config_bos_eos_flags_do_not_override_tokenizer_json(
    tmp_path: Path, auto_tokenizer_for: Callable[[Path], object],
) -> None:
    # transformers 5 ignores add_bos_token / add_eos_token when tokenizer.json exists.
    model_dir = write_hf_tokenizer(tmp_path, 300, add_bos_token=True)
    _edit_config(model_dir, add_bos_token=False, add_eos_token=True)
    ours, reference = load_tokenizer(model_dir), auto_tokenizer_for(model_dir)
    assert ours.encode("hello")[0] == 1
    assert ours.encode("hello")[-1] != 2
    assert ours.encode("hello") == reference.encode("hello")


def _edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_named_token_missing_from_vocab_is_added_like_transformers(
    tmp_path: Path, auto_tokenizer_for: Callable[[Path], object],
) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    _edit_config(model_dir, sep_token="<sep>")
    ours, reference = load_tokenizer(model_dir), auto_tokenizer_for(model_dir)
    assert ours.encode("a<sep>b") == reference.encode("a<sep>b")
    assert ours.encode("<sep>", add_special_tokens=False) == [300]
    assert ours.vocab_size == 301
    assert 300 in ours.all_special_ids


def test_split_special_tokens_encodes_their_text(
    tmp_path: Path, auto_tokenizer_for: Callable[[Path], object],
) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    _edit_config(model_dir, split_special_tokens=True)
    ours, reference = load_tokenizer(model_dir), auto_tokenizer_for(model_dir)
    ids = ours.encode("<s>hi", add_special_tokens=False)
    assert 1 not in ids
    assert ours.decode(ids) == "<s>hi"
    assert ids == reference.encode("<s>hi", add_special_tokens=False)


def test_special_tokens_map_file_fills_what_the_config_leaves_out(tmp_path: Path) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(model_dir).eos_token_id == 2


def test_token_bytes_join_to_the_decoded_text(hf_tokenizer: Tokenizer) -> None:
    text = "Emoji 😀🚀 你好 café"
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(hf_tokenizer.token_bytes(i) for i in ids) == text.encode()
    assert hf_tokenizer.token_bytes(1) == b"<s>"


# A model whose embedding has more rows than the tokenizer has tokens (Qwen2, OPT, padded
# checkpoints) can sample those ids: they decode to nothing, as in transformers.
@pytest.mark.parametrize("token_id", [384, 10_000, 2**40])
def test_ids_past_the_vocabulary_decode_to_nothing(hf_tokenizer: Tokenizer,
                                                   auto_tokenizer: Any, token_id: int) -> None:
    ids = [*hf_tokenizer.encode("Hi 你好", add_special_tokens=False), token_id, 70]
    assert hf_tokenizer.decode(ids) == auto_tokenizer.decode([i for i in ids if i < 2**32])
    assert hf_tokenizer.decode(ids) == "Hi 你好a"
    assert hf_tokenizer.token_bytes(token_id) == b""


def test_negative_ids_are_rejected(hf_tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError) as info:
        hf_tokenizer.decode([5, -1])
    assert (str(info.value), info.value.param) == ("token ids must be non-negative, got -1",
                                                   "token_ids")
    with pytest.raises(InvalidRequestError):
        hf_tokenizer.token_bytes(-1)


def test_unsupported_decoder_is_a_load_error(tmp_path: Path) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    data = json.loads((model_dir / "tokenizer.json").read_text())
    data["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": True}
    (model_dir / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(TokenizerLoadError, match=r"^tokenizer.json decoder 'WordPiece' is not "
                                                 r"supported; supported decoders: ByteLevel, "):
        HFTokenizer.from_dir(model_dir)


def test_malformed_files_are_load_errors(tmp_path: Path) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    _edit_config(model_dir, bos_token=7)
    with pytest.raises(TokenizerLoadError, match=r"^tokenizer_config.json: bos_token must be a "
                                                 r"string or an AddedToken object, got 7$"):
        load_tokenizer(model_dir)
    _edit_config(model_dir, bos_token="<s>", split_special_tokens="yes")
    with pytest.raises(TokenizerLoadError, match=r"split_special_tokens must be true or false, "
                                                 r"got 'yes'$"):
        load_tokenizer(model_dir)
    (model_dir / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=r"^cannot load .*tokenizer.json: "):
        load_tokenizer(model_dir)


def test_chat_template_file_and_named_templates(tmp_path: Path) -> None:
    model_dir = write_hf_tokenizer(tmp_path, 300)
    _edit_config(model_dir, chat_template=[{"name": "tool_use", "template": "T"},
                                           {"name": "default", "template": "D"}])
    assert load_tokenizer(model_dir).chat_template == "D"
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    ours = load_tokenizer(model_dir)
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
