"""The bytes each token of a Hugging Face ``tokenizer.json`` vocabulary stands for.

``tokenizers`` decodes a whole id list at once and returns text, which hides the bytes a single
token contributes when it holds only part of a UTF-8 character. Incremental detokenization
needs those bytes, so this module reads the ``decoder`` section of ``tokenizer.json`` and
applies the same per-token rules:

- ``ByteLevel`` (GPT-2, Llama 3, Qwen2, OPT): each character of a token stands for one byte
  through the GPT-2 byte↔unicode table; a token with a character outside the table (an added
  token such as ``" spaced"``) stands for its own UTF-8.
- ``Metaspace`` / ``Replace`` (SentencePiece, Llama 2, Mistral): the replacement character
  (``▁``) is a space.
- ``ByteFallback``: a ``<0xNN>`` token is the byte NN.
- ``Fuse`` changes nothing per token; ``Strip`` of one leading space, and ``Metaspace`` with a
  prepend scheme, drop the space of a text's first token (reported as
  ``strips_leading_space``).

Other decoders (WordPiece, CTC, ...) belong to encoder models and raise TokenizerLoadError.
Invalid UTF-8 then decodes to U+FFFD per maximal invalid subsequence, as ``ByteLevel`` does;
a ``ByteFallback`` decoder writes one U+FFFD per byte instead, so the two differ only on
invalid byte runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

# One decoder step: a token as text (not yet bytes) or bytes → the same.
_Step = Callable[[str | bytes], str | bytes]

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True, slots=True)
class TokenByteDecoder:
    """Maps a vocabulary token (its string in ``tokenizer.json``) to the bytes it decodes to."""

    steps: tuple[_Step, ...]
    strips_leading_space: bool

    def __call__(self, token: str) -> bytes:
        piece: str | bytes = token
        for step in self.steps:
            piece = step(piece)
        return piece if isinstance(piece, bytes) else piece.encode("utf-8")


def build_token_byte_decoder(decoder: Mapping[str, Any] | None) -> TokenByteDecoder:
    """The per-token byte mapping of a ``tokenizer.json`` ``decoder`` section."""
    if decoder is None:
        raise TokenizerLoadError(
            "tokenizer.json has no decoder; supported decoders: ByteLevel, Metaspace, "
            "Replace, ByteFallback, Fuse, Strip"
        )
    parts = decoder["decoders"] if decoder.get("type") == "Sequence" else [decoder]
    steps: list[_Step] = []
    strips = False
    for part in parts:
        step, part_strips = _step(part)
        strips = strips or part_strips
        if step is not None:
            steps.append(step)
    return TokenByteDecoder(tuple(steps), strips)


def _step(part: Mapping[str, Any]) -> tuple[_Step | None, bool]:
    kind = part.get("type")
    if kind == "ByteLevel":
        return _byte_level, False
    if kind == "ByteFallback":
        return _byte_fallback, False
    if kind == "Metaspace":
        scheme = part.get("prepend_scheme", "always" if part.get("add_prefix_space") else "never")
        return _replace(part.get("replacement", "▁"), " "), scheme != "never"
    if kind == "Replace":
        return _replace(_string_pattern(part), part["content"]), False
    if kind == "Strip":
        return None, _check_strip(part)
    if kind == "Fuse":  # joins the tokens' texts; nothing changes per token
        return None, False
    raise TokenizerLoadError(
        f"tokenizer.json decoder {kind!r} is not supported; supported decoders: ByteLevel, "
        "Metaspace, Replace, ByteFallback, Fuse, Strip"
    )


def _string_pattern(part: Mapping[str, Any]) -> str:
    pattern = part.get("pattern", {})
    if "String" not in pattern:
        raise TokenizerLoadError(
            f"tokenizer.json Replace decoder with pattern {pattern!r} is not supported; "
            "only plain String patterns are"
        )
    return pattern["String"]


def _check_strip(part: Mapping[str, Any]) -> bool:
    content, start, stop = part.get("content"), part.get("start", 0), part.get("stop", 0)
    if content != " " or start > 1 or stop != 0:
        raise TokenizerLoadError(
            f"tokenizer.json Strip decoder (content={content!r}, start={start}, stop={stop}) "
            "is not supported; only stripping one leading space is"
        )
    return start == 1


def _replace(old: str, new: str) -> _Step:
    def step(piece: str | bytes) -> str | bytes:
        return piece.replace(old, new) if isinstance(piece, str) else piece

    return step


def _byte_fallback(piece: str | bytes) -> str | bytes:
    if isinstance(piece, str) and len(piece) == 6 and (match := _BYTE_FALLBACK.fullmatch(piece)):
        return bytes([int(match.group(1), 16)])
    return piece


def _byte_level(piece: str | bytes) -> str | bytes:
    if isinstance(piece, bytes):
        return piece
    table = unicode_to_byte()
    try:
        return bytes(table[char] for char in piece)
    except KeyError:
        return piece.encode("utf-8")


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte → printable-character table used by byte-level BPE.

    Bytes that are printable Latin-1 characters stand for themselves; the other 68 bytes are
    moved, in byte order, to the characters from U+0100 upwards.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(printable)
    table = {chr(b): b for b in printable}
    moved = (b for b in range(256) if b not in kept)
    for offset, byte in enumerate(moved):
        table[chr(256 + offset)] = byte
    return table
