"""A tokenizer backed by a tiktoken encoding, for checkpoints that name one in ``tiktoken.json``.

``tiktoken.json`` holds ``{"encoding": "cl100k_base", "eos_token": "<|endoftext|>"}`` and may
add ``bos_token`` (prepended when encoding with special tokens) and ``chat_template``. The
encoding loads offline through ``pagedserve.common.encoding``, so client, load generator and
server count the same tokens.

Special-token text in the input (``<|endoftext|>``) is encoded as ordinary text unless the
caller names it in ``allowed_special``: a prompt can never smuggle in a control token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence, Set
from pathlib import Path

import tiktoken

from pagedserve.common.encoding import load_encoding
from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.chat_template import checked_chat_template

TIKTOKEN_FILE = "tiktoken.json"
_KEYS = frozenset({"encoding", "eos_token", "bos_token", "chat_template"})


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding with the checkpoint's BOS/EOS choice."""

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        *,
        name: str,
        eos_token: str | None = None,
        bos_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self._encoding = encoding
        self.name = name
        self.vocab_size = encoding.n_vocab
        self.all_special_ids = frozenset(
            encoding.encode_single_token(text) for text in encoding.special_tokens_set
        )
        named = {"bos_token": bos_token, "eos_token": eos_token}
        self.special_tokens_map = {key: text for key, text in named.items() if text is not None}
        self.bos_token_id = self._special_id(bos_token)
        self.eos_token_id = self._special_id(eos_token)
        self.chat_template = checked_chat_template(chat_template, f"tiktoken encoding {name!r}")

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> TiktokenTokenizer:
        """The tokenizer ``model_dir/tiktoken.json`` describes."""
        path = Path(model_dir) / TIKTOKEN_FILE
        spec = _read_spec(path)
        try:
            encoding = load_encoding(spec["encoding"])
        except ValueError as exc:
            raise TokenizerLoadError(f"{path}: unknown tiktoken encoding "
                                     f"{spec['encoding']!r}: {exc}") from exc
        try:
            return cls(encoding, name=spec["encoding"], eos_token=spec.get("eos_token"),
                       bos_token=spec.get("bos_token"), chat_template=spec.get("chat_template"))
        except TokenizerLoadError as exc:
            raise TokenizerLoadError(f"{path}: {exc}") from exc

    def encode(
        self, text: str, add_special_tokens: bool = True, *, allowed_special: Set[str] = frozenset()
    ) -> list[int]:
        """Token ids of ``text``; only the special tokens in ``allowed_special`` are matched."""
        unknown = set(allowed_special) - self._encoding.special_tokens_set
        if unknown:
            raise InvalidRequestError(
                f"allowed_special names {sorted(unknown)}, which are not special tokens of "
                f"{self.name!r} (its special tokens: {sorted(self._encoding.special_tokens_set)})",
                param="allowed_special",
            )
        ids = self._encoding.encode(text, allowed_special=set(allowed_special),
                                    disallowed_special=())
        if add_special_tokens and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def encode_text(self, text: str) -> list[int]:
        return self.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(token_ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.all_special_ids]
        try:
            return self._encoding.decode(ids, errors="replace")
        except (KeyError, OverflowError, ValueError):
            # An unassigned or negative id: rare, so the per-token path serves it.
            data = b"".join(self.token_bytes(i) for i in ids)
            return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise self.negative_token_error(token_id)
        try:
            return self._encoding.decode_single_token_bytes(token_id)
        except (KeyError, OverflowError):
            return b""  # unassigned in this encoding (or past its end): no text

    def _special_id(self, text: str | None) -> int | None:
        if text is None:
            return None
        if text not in self._encoding.special_tokens_set:
            raise TokenizerLoadError(
                f"{text!r} is not a special token of tiktoken encoding {self.name!r} "
                f"(its special tokens: {sorted(self._encoding.special_tokens_set)})"
            )
        return self._encoding.encode_single_token(text)


def _read_spec(path: Path) -> dict[str, str]:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(spec, dict):
        raise TokenizerLoadError(f"{path} must hold a JSON object, got {type(spec).__name__}")
    unknown = set(spec) - _KEYS
    if unknown:
        raise TokenizerLoadError(f"{path}: unknown keys {sorted(unknown)}; "
                                 f"allowed keys: {sorted(_KEYS)}")
    if not isinstance(spec.get("encoding"), str):
        raise TokenizerLoadError(f"{path}: 'encoding' must name a tiktoken encoding, "
                                 f"got {spec.get('encoding')!r}")
    for key in _KEYS - {"encoding"}:
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise TokenizerLoadError(f"{path}: {key!r} must be a string, got {spec[key]!r}")
    return spec
