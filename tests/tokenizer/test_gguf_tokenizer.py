"""The tokenizer in a GGUF file's metadata against transformers' GGUF tokenizer on the same
file: byte-level BPE (SmolLM2's, and a toy one) and SentencePiece (a toy one with scores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer
from pagedserve.server.tokenizer.gguf_vocab import merges_from_scores
from pagedserve.server.tokenizer.loader import load_tokenizer
from tests.checkpoints import checkpoint_fixture
from tests.gguf_files import write_gguf
from tests.smollm2 import smollm2_file

CORPUS = [
    "Hello world", "the cat is at the inn", "", " ", "\n", "  two leading spaces",
    "runs   of    spaces\n\n\n\ttabs\t\tand\r\nCRLF  ", "trailing   ", "x  \n  y",
    "naïve café — 東京 🤖 emoji, ß Σ ﬁ ǅ", "don't I'll WE'RE they've", "numbers 12345 and 3.14159",
    "<|im_start|>user\nhi<|im_end|>\n", "a<|im_end|>b<|endoftext|>c", "<think>x</think>",
    "<s>hello</s> <unk>", "[PAD3]", "▁already▁marked", "\u00a0nbsp\u200bzero-width",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?  Answer\tplease."},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 東京?"},
]

llama_checkpoint = checkpoint_fixture("llama")


@pytest.fixture(scope="module", params=["gpt2", "spm", "smollm2"])
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "smollm2":
        return smollm2_file()
    checkpoint = request.getfixturevalue("llama_checkpoint")
    path = tmp_path_factory.mktemp("gguf-tok") / f"{request.param}.gguf"
    return write_gguf(path, checkpoint, tokenizer=request.param)


@pytest.fixture(scope="module")
def tokenizers(gguf_file: Path):
    """(ours, transformers') for one file."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return load_tokenizer(gguf_file), reference


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_agrees_with_transformers(tokenizers, add_special_tokens: bool) -> None:
    ours, reference = tokenizers
    for text in CORPUS:
        assert ours.encode(text, add_special_tokens) == reference.encode(
            text, add_special_tokens=add_special_tokens), text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_agrees_with_transformers(tokenizers, skip_special_tokens: bool) -> None:
    ours, reference = tokenizers
    for text in CORPUS:
        ids = reference.encode(text)
        assert ours.decode(ids, skip_special_tokens) == reference.decode(
            ids, skip_special_tokens=skip_special_tokens), text


def test_streamed_text_equals_decode(tokenizers) -> None:
    ours, _ = tokenizers
    for text in CORPUS:
        ids = ours.encode(text, add_special_tokens=False)
        stream = IncrementalDetokenizer(ours, prompt_token_ids=[])
        deltas = [stream.add_tokens([token]) for token in ids]
        assert "".join(deltas) + stream.flush() == ours.decode(ids), text


def test_special_tokens_and_chat_template_come_from_the_metadata(tokenizers) -> None:
    ours, reference = tokenizers
    assert (ours.bos_token_id, ours.eos_token_id) == (reference.bos_token_id,
                                                      reference.eos_token_id)
    assert ours.chat_template == reference.chat_template
    assert ours.apply_chat_template(MESSAGES) == reference.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)


def test_smollm2_frames_no_bos_and_ends_turns_with_im_end() -> None:
    tokenizer = load_tokenizer(smollm2_file())
    assert tokenizer.encode("Hi") == tokenizer.encode("Hi", add_special_tokens=False)
    assert tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False) == "<|im_end|>"
    assert tokenizer.vocab_size == 49152


def test_sentencepiece_merges_rank_by_the_joined_pieces_score() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0]
    assert merges_from_scores(tokens, scores) == [
        ("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc"),
    ]
