"""A ``tokenizers`` backend from a GGUF vocabulary (``tokenizer.ggml.*``), as llama.cpp reads it.

- ``gpt2``: byte-level BPE. Tokens are spelled in GPT-2's byte alphabet; a token with a
  character outside it (an added token stored as plain text) is respelled byte by byte. The
  merges come from the file; the pre-tokenizer's split follows ``tokenizer.ggml.pre``.
- ``llama``: SentencePiece BPE with byte fallback (``<0xNN>`` tokens) and ``▁`` for spaces. The
  merges are the file's if it lists them, else recovered from the scores: SentencePiece merges
  the adjacent pair whose joined piece scores highest, so every split of a piece into two
  pieces of the vocabulary is a merge ranked by the piece's score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from tokenizers import Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

SPACE = "▁"
# llama.cpp's pre-tokenizer regexes by ``tokenizer.ggml.pre``; others split as GPT-2 does.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Pre-tokenizers that split every digit apart before GPT-2's regex (SmolLM's own tokenizer).
_DIGIT_SPLITS = frozenset({"smollm", "starcoder", "refact"})


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character table (printable Latin-1 bytes map to themselves,
    the rest to code points from 256 on, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in table)
    return table | {b: chr(256 + i) for i, b in enumerate(extra)}


@lru_cache(maxsize=1)
def byte_characters() -> frozenset[str]:
    return frozenset(byte_alphabet().values())


def byte_level_spelling(token: str) -> str:
    if byte_characters().issuperset(token):
        return token
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in token.encode("utf-8"))


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    return {token: index for index, token in enumerate(tokens)}


def _merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for line in merges:
        left, sep, right = line.partition(" ")
        if not sep or not left or not right:
            raise TokenizerLoadError(f"GGUF merge {line!r} is not two tokens")
        pairs.append((left, right))
    return pairs


def byte_level_bpe(tokens: Sequence[str], merges: Sequence[str], pre: str | None) -> Any:
    """The ``gpt2`` model: byte-level BPE split as ``pre`` names."""
    vocab = _vocab([byte_level_spelling(t) for t in tokens])
    backend = BackendTokenizer(BPE(vocab=vocab, merges=_merges(merges), fuse_unk=False))
    split = _SPLITS.get(pre or "")
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if pre in _DIGIT_SPLITS:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece's implicit merges: best-scoring result first; among equal scores the
    longer left part first, then the longer right part, then vocabulary order."""
    vocab = _vocab(tokens)
    ranked = []
    for index, piece in enumerate(tokens):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                key = (-scores[index], -len(left), -len(right), index, vocab[left], vocab[right])
                ranked.append((key, (left, right)))
    ranked.sort(key=lambda item: item[0])
    return [pair for _, pair in ranked]


def sentencepiece_bpe(
    tokens: Sequence[str], scores: Sequence[float] | None, merges: Sequence[str] | None,
    unk_token: str | None, add_space_prefix: bool,
) -> Any:
    """The ``llama`` model: SentencePiece BPE with byte fallback."""
    if merges:
        pairs = _merges(merges)
    elif scores is not None and len(scores) == len(tokens):
        pairs = merges_from_scores(tokens, scores)
    else:
        raise TokenizerLoadError(
            "GGUF SentencePiece vocabulary needs tokenizer.ggml.scores (one per token) or "
            "tokenizer.ggml.merges"
        )
    model = BPE(vocab=_vocab(tokens), merges=pairs, unk_token=unk_token, fuse_unk=True,
                byte_fallback=True)
    backend = BackendTokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def build_backend(kind: str, vocab: Mapping[str, Any]) -> Any:
    """The backend for ``tokenizer.ggml.model`` ``kind`` from the ``tokenizer.ggml.*`` values
    (keys without the prefix)."""
    tokens = vocab["tokens"]
    if kind == "gpt2":
        if not vocab.get("merges"):
            raise TokenizerLoadError("GGUF byte-level BPE vocabulary has no tokenizer.ggml.merges")
        return byte_level_bpe(tokens, vocab["merges"], vocab.get("pre"))
    if kind == "llama":
        unk_id = vocab.get("unknown_token_id")
        unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
        return sentencepiece_bpe(tokens, vocab.get("scores"), vocab.get("merges"), unk,
                                 vocab.get("add_space_prefix", True))
    raise TokenizerLoadError(
        f"unsupported GGUF tokenizer model {kind!r}; supported: gpt2 (byte-level BPE), "
        f"llama (SentencePiece)"
    )
