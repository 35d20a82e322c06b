"""Per-token bytes for SentencePiece-style vocabularies, and the decoders that are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from pagedserve.server.tokenizer import IncrementalDetokenizer, TokenizerLoadError, load_tokenizer
from pagedserve.server.tokenizer.hf_token_bytes import build_token_byte_decoder, unicode_to_byte

PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "el", "lo", "▁w", "or"]
MERGES = [("▁", "h"), ("e", "l"), ("l", "o"), ("▁", "w"), ("o", "r")]
LLAMA2_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])


def write_sentencepiece_style(model_dir: Path, metaspace: bool = False) -> Path:
    """A Llama-2-like vocabulary: ``▁`` marks spaces, unknown characters fall back to bytes."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({piece: 259 + i for i, piece in enumerate(PIECES)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, unk_token="<unk>",
                                     byte_fallback=True, fuse_unk=True))
    if metaspace:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁",
                                                           prepend_scheme="always")
        tokenizer.decoder = decoders.Sequence([
            decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always"),
        ])
    else:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                     normalizers.Replace(" ", "▁")])
        tokenizer.decoder = LLAMA2_DECODER
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in ("<unk>", "<s>", "</s>")])
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


@pytest.fixture(scope="module", params=[False, True], ids=["llama2", "metaspace"])
def sp_tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(write_sentencepiece_style(tmp_path_factory.mktemp("sp"),
                                                    request.param))


def test_pieces_are_spaces_and_fallback_bytes(sp_tokenizer) -> None:
    ids = sp_tokenizer.encode("hello world 你", add_special_tokens=False)
    assert [sp_tokenizer.token_bytes(i) for i in ids] == [
        b" h", b"el", b"lo", b" w", b"or", b"l", b"d", b" ", b"\xe4", b"\xbd", b"\xa0",
    ]
    assert sp_tokenizer.strips_leading_space is True
    assert sp_tokenizer.decode(ids) == "hello world 你"


def test_output_after_a_text_prompt_keeps_its_first_space(sp_tokenizer) -> None:
    prompt = sp_tokenizer.encode("hello", add_special_tokens=False)
    output = sp_tokenizer.encode("world 你", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(sp_tokenizer, prompt)
    text = "".join(detokenizer.add_tokens([t]) for t in output) + detokenizer.flush()
    full, head = sp_tokenizer.decode(prompt + output), sp_tokenizer.decode(prompt)
    assert text == full[len(head):] == " world 你"


def test_output_at_the_start_of_the_text_drops_its_first_space(sp_tokenizer) -> None:
    output = sp_tokenizer.encode("world 你", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(sp_tokenizer, [1])  # only <s>, which is skipped
    deltas = [detokenizer.add_tokens([t]) for t in output]
    assert deltas == ["w", "or", "l", "d", " ", "", "", "你"]
    assert "".join(deltas) == sp_tokenizer.decode(output) == "world 你"


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=list("helowrd 你😀é"), max_size=16))
def test_streamed_text_equals_decode(sp_tokenizer, text: str) -> None:
    ids = sp_tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(sp_tokenizer, [1])
    deltas = [detokenizer.add_tokens([t]) for t in ids]
    assert not any("\ufffd" in delta for delta in deltas)
    assert "".join(deltas) + detokenizer.flush() == sp_tokenizer.decode(ids)


def test_kept_special_prompt_token_keeps_the_space(sp_tokenizer) -> None:
    output = sp_tokenizer.encode("world", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(sp_tokenizer, [1], skip_special_tokens=False)
    assert detokenizer.add_tokens(output) == " world"


def test_unicode_to_byte_is_the_byte_level_alphabet() -> None:
    table = unicode_to_byte()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(table.values()) == list(range(256))
    assert (table["Ġ"], table["!"], table["Ā"]) == (32, 33, 0)


@pytest.mark.parametrize(("token", "expected"), [
    ("Ġx", b" x"),  # every character is in the byte table
    ("é!", b"\xe9!"),  # é stands for the byte 0xE9, not for its UTF-8
    (" spaced", b" spaced"),  # a space is outside the table: the token is its own UTF-8
    ("<|im_end|>", b"<|im_end|>"),
])
def test_byte_level_tokens_match_the_tokenizers_decoder(token: str, expected: bytes) -> None:
    data = build_token_byte_decoder({"type": "ByteLevel"})(token)
    assert data == expected
    assert data.decode("utf-8", "replace") == decoders.ByteLevel().decode([token])


@pytest.mark.parametrize(
    ("decoder", "error"),
    [
        (None, "tokenizer.json has no decoder; supported decoders: ByteLevel, Metaspace, "
               "Replace, ByteFallback, Fuse, Strip"),
        ({"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "},
         "tokenizer.json Replace decoder with pattern {'Regex': '▁+'} is not supported; only "
         "plain String patterns are"),
        ({"type": "Strip", "content": " ", "start": 0, "stop": 1},
         "tokenizer.json Strip decoder (content=' ', start=0, stop=1) is not supported; only "
         "stripping one leading space is"),
        ({"type": "Sequence", "decoders": [{"type": "CTC", "pad_token": "<pad>"}]},
         "tokenizer.json decoder 'CTC' is not supported; supported decoders: ByteLevel, "
         "Metaspace, Replace, ByteFallback, Fuse, Strip"),
    ],
)
def test_unsupported_decoders(decoder: dict | None, error: str) -> None:
    with pytest.raises(TokenizerLoadError) as info:
        build_token_byte_decoder(decoder)
    assert str(info.value) == error
