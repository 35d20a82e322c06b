"""A tokenizer backed by a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).

Encoding follows transformers' ``AutoTokenizer`` on the same directory (its
``PreTrainedTokenizerFast`` path): special-token text in the input is matched as special
tokens (unless the config sets ``split_special_tokens``); named special tokens missing from the
vocabulary are added after it; ``tokenizer.json``'s post-processor decides which BOS/EOS
``add_special_tokens`` adds. Padding and truncation stored in ``tokenizer.json`` are switched
off: the engine sees whole prompts.

Decoding never applies transformers' ``clean_up_tokenization_spaces``, which transformers
itself ignores for BPE vocabularies since it would delete real spaces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.hf_config import HFTokenizerConfig, read_hf_tokenizer_config
from pagedserve.server.tokenizer.hf_token_bytes import TokenByteDecoder, build_token_byte_decoder

TOKENIZER_FILE = "tokenizer.json"


class HFTokenizer(Tokenizer):
    """``tokenizer.json`` plus the checkpoint's tokenizer config."""

    def __init__(self, backend: BackendTokenizer, config: HFTokenizerConfig, name: str) -> None:
        self._backend = backend
        decoder = backend.decoder
        self._byte_decoder: TokenByteDecoder = build_token_byte_decoder(
            None if decoder is None else json.loads(decoder.__getstate__())
        )
        backend.no_padding()
        backend.no_truncation()
        backend.encode_special_tokens = config.split_special_tokens
        self._add_missing_special_tokens(config)
        self.name = name
        self.special_tokens_map = dict(config.special_tokens)
        self.chat_template = config.chat_template
        self.bos_token_id = self._named_id("bos_token")
        self.eos_token_id = self._named_id("eos_token")
        self.strips_leading_space = self._byte_decoder.strips_leading_space
        added = backend.get_added_tokens_decoder()
        self.all_special_ids = frozenset(i for i, token in added.items() if token.special)
        self.special_texts = (frozenset() if config.split_special_tokens else
                              frozenset(t.content for t in added.values() if t.special))
        self._plain_backend: BackendTokenizer | None = None
        self.vocab_size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self._token_bytes: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> HFTokenizer:
        """The tokenizer of a checkpoint directory holding ``tokenizer.json``."""
        path = Path(model_dir)
        try:
            backend = BackendTokenizer.from_file(str(path / TOKENIZER_FILE))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise TokenizerLoadError(f"cannot load {path / TOKENIZER_FILE}: {exc}") from exc
        return cls(backend, read_hf_tokenizer_config(path), name=path.name)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_text(self, text: str) -> list[int]:
        return self._plain().encode(text, add_special_tokens=False).ids

    def _plain(self) -> BackendTokenizer:
        # A copy that spells special tokens out: the flag is the backend's, not per call, and
        # the tokenizer pool encodes on several threads at once.
        if self._plain_backend is None:
            plain = BackendTokenizer.from_str(self._backend.to_str())
            plain.no_padding()
            plain.no_truncation()
            plain.encode_special_tokens = True
            self._plain_backend = plain
        return self._plain_backend

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(token_ids)
        for token_id in ids:
            if token_id < 0:
                raise self.negative_token_error(token_id)
        # ``tokenizers`` leaves out ids it has no token for, as transformers does; ids past
        # its 32-bit range have none either.
        ids = [i for i in ids if i < 2**32]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._token_bytes.get(token_id)
        if cached is not None:
            return cached
        if token_id < 0:
            raise self.negative_token_error(token_id)
        token = self._backend.id_to_token(token_id) if token_id < 2**32 else None
        if token is None:
            return b""  # a row of the model's embedding the tokenizer has no token for
        data = self._token_bytes[token_id] = self._byte_decoder(token)
        return data

    def _named_id(self, key: str) -> int | None:
        text = self.special_tokens_map.get(key)
        return None if text is None else self._backend.token_to_id(text)

    def _add_missing_special_tokens(self, config: HFTokenizerConfig) -> None:
        # transformers appends a named special token the vocabulary lacks; so must we, or the
        # two would disagree on its id.
        missing = [
            AddedToken(text, special=True, normalized=False)
            for text in dict.fromkeys(config.special_tokens.values())
            if self._backend.token_to_id(text) is None
        ]
        if missing:
            self._backend.add_special_tokens(missing)
