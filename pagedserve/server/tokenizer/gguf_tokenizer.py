"""The tokenizer and chat template of a GGUF file, as an ``HFTokenizer``.

The vocabulary becomes a ``tokenizers`` backend (``gguf_vocab.py``); tokens the file marks as
unknown or control (types 2 and 3) are special tokens, matched whole in text and skipped when
decoding with ``skip_special_tokens``; user-defined ones (type 4) are matched whole but kept.
The named special tokens (BOS, EOS, unknown, padding) come from their ids, ``add_bos_token``
/ ``add_eos_token`` frame an encoding as llama.cpp does (BOS by default for SentencePiece
vocabularies, which predate the flag), and ``tokenizer.chat_template`` is the chat template.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors

from pagedserve.common.gguf_file import GGUFFileError, metadata_value, open_gguf
from pagedserve.server.tokenizer.chat_template import checked_chat_template
from pagedserve.server.tokenizer.gguf_vocab import build_backend, byte_characters
from pagedserve.server.tokenizer.hf import HFTokenizer
from pagedserve.server.tokenizer.hf_config import HFTokenizerConfig
from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

PREFIX = "tokenizer.ggml."
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
_NAMED_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}
_VOCAB_KEYS = ("tokens", "scores", "token_type", "merges", "pre", "add_space_prefix",
               "unknown_token_id")


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> HFTokenizer:
    """The tokenizer a GGUF file's metadata describes."""
    try:
        reader = open_gguf(path)
        return _build(reader, Path(path))
    except GGUFFileError as exc:
        raise TokenizerLoadError(str(exc)) from exc


def _build(reader: Any, path: Path) -> HFTokenizer:
    kind = metadata_value(reader, PREFIX + "model")
    tokens = metadata_value(reader, PREFIX + "tokens")
    if kind is None or not tokens:
        raise TokenizerLoadError(f"GGUF file {str(path)!r} has no tokenizer (tokenizer.ggml.*)")
    vocab = {key: metadata_value(reader, PREFIX + key) for key in _VOCAB_KEYS}
    vocab = {key: value for key, value in vocab.items() if value is not None}
    backend = build_backend(kind, vocab)
    _add_marked_tokens(backend, tokens, vocab.get("token_type"), byte_level=kind == "gpt2")
    special = {}
    for name, key in _NAMED_IDS.items():
        token_id = metadata_value(reader, PREFIX + key)
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            special[name] = tokens[token_id]
    add_bos = metadata_value(reader, PREFIX + "add_bos_token", kind == "llama")
    add_eos = metadata_value(reader, PREFIX + "add_eos_token", False)
    backend.post_processor = _framing(special, backend, add_bos, add_eos)
    template = checked_chat_template(metadata_value(reader, "tokenizer.chat_template"), str(path))
    config = HFTokenizerConfig(special_tokens=special, chat_template=template)
    return HFTokenizer(backend, config, name=path.stem)


def _add_marked_tokens(
    backend: Any, tokens: list[str], types: list[int] | None, byte_level: bool
) -> None:
    if not types:
        return
    spelled = byte_characters()
    control = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, types)
        # In a byte-level vocabulary a real token is spelled in the byte alphabet; a control
        # token that is not is a converter's mislabel and stays out.
        if kind in (UNKNOWN, CONTROL) and (not byte_level or set(token) <= spelled)
    ]
    user = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, types) if kind == USER_DEFINED
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _framing(special: dict[str, str], backend: Any, add_bos: bool, add_eos: bool) -> Any:
    """A post-processor that adds BOS / EOS as the file asks (and nothing otherwise)."""
    bos = special.get("bos_token") if add_bos else None
    eos = special.get("eos_token") if add_eos else None
    single = " ".join(t for t in (bos and f"{bos}:0", "$A:0", eos and f"{eos}:0") if t)
    pair = " ".join(t for t in (single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1") if t)
    specials = [(t, backend.token_to_id(t)) for t in dict.fromkeys((bos, eos)) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
