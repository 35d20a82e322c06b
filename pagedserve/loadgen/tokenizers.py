"""Token counting for prompt lengths and the output-token fallback.

Two sources: a tiktoken encoding on this machine, or the server's own tokenizer through
``POST /tokenize``. Counting is async so both share one interface; it only ever runs before
or after the timed part of a run, never between requests. Each can also split a text into its
tokens' texts (the server through ``POST /detokenize``), which the prompt builder draws on
where a tokenizer's vocabulary keeps few English words whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import aiohttp
import orjson

from pagedserve.common.encoding import load_encoding
from pagedserve.loadgen.bench_errors import TokenizerError

SERVER_TOKENIZER = "server"


class TokenCounter(Protocol):
    name: str

    async def count(self, texts: Sequence[str]) -> list[int]:
        """The number of tokens of each text."""
        ...


@runtime_checkable
class TokenSplitter(Protocol):
    name: str

    async def count(self, texts: Sequence[str]) -> list[int]:
        ...

    async def tokens(self, text: str) -> list[int]:
        """The token ids of ``text``, no special tokens added."""
        ...

    async def decode(self, token_lists: Sequence[Sequence[int]]) -> list[str]:
        """The text of each list of token ids (bytes that end mid-character as U+FFFD)."""
        ...


class TiktokenCounter:
    """Counts with a local tiktoken encoding; special-token text is counted as plain text."""

    def __init__(self, encoding_name: str = "cl100k_base") -> None:
        try:
            self._encoding = load_encoding(encoding_name)
        except ValueError as exc:
            raise TokenizerError(
                f"--tokenizer {encoding_name!r} is neither a tiktoken encoding, a local "
                f"directory with tokenizer.json, nor 'server' (nothing is downloaded): {exc}"
            ) from exc
        self.name = encoding_name

    def count_sync(self, texts: Sequence[str]) -> list[int]:
        return [len(self._encoding.encode_ordinary(text)) for text in texts]

    async def count(self, texts: Sequence[str]) -> list[int]:
        return self.count_sync(texts)

    async def tokens(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    async def decode(self, token_lists: Sequence[Sequence[int]]) -> list[str]:
        return [self._encoding.decode(list(ids), errors="replace") for ids in token_lists]


class ServerTokenCounter:
    """Counts with the server's ``POST /tokenize`` (``{"model", "prompt"} → {"count", ...}``)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str,
                 max_parallel: int = 16, headers: dict[str, str] | None = None) -> None:
        self._session = session
        self._url = base_url.rstrip("/") + "/tokenize"
        self._detokenize_url = base_url.rstrip("/") + "/detokenize"
        self._model = model
        self._headers = headers or {}
        self._slots = asyncio.Semaphore(max_parallel)
        self.name = SERVER_TOKENIZER

    async def count(self, texts: Sequence[str]) -> list[int]:
        return list(await asyncio.gather(*(self._count_one(text) for text in texts)))

    async def tokens(self, text: str) -> list[int]:
        payload = {"model": self._model, "prompt": text, "add_special_tokens": False}
        return _field(self._url, await self._post(self._url, payload), "tokens", list)

    async def decode(self, token_lists: Sequence[Sequence[int]]) -> list[str]:
        return list(await asyncio.gather(*(self._decode_one(ids) for ids in token_lists)))

    async def _decode_one(self, token_ids: Sequence[int]) -> str:
        payload = {"model": self._model, "tokens": list(token_ids)}
        body = await self._post(self._detokenize_url, payload)
        return _field(self._detokenize_url, body, "prompt", str)

    async def _count_one(self, text: str) -> int:
        body = await self._post(self._url, {"model": self._model, "prompt": text})
        return _count_from_body(self._url, body)

    async def _post(self, url: str, payload: dict) -> bytes:
        async with self._slots:
            try:
                async with self._session.post(url, json=payload,
                                              headers=self._headers) as response:
                    body = await response.read()
                    status = response.status
            except aiohttp.ClientError as exc:
                raise TokenizerError(f"POST {url} failed: {exc!r}") from exc
        if status != 200:
            raise TokenizerError(f"POST {url} answered HTTP {status}: {body[:200]!r}")
        return body


def _json(url: str, body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise TokenizerError(f"POST {url} answered non-JSON: {body[:200]!r}") from exc


def _field(url: str, body: bytes, name: str, kind: type) -> Any:
    data = _json(url, body)
    if isinstance(data, dict) and isinstance(data.get(name), kind):
        return data[name]
    raise TokenizerError(f"POST {url} answered without {name!r}: {body[:200]!r}")


def _count_from_body(url: str, body: bytes) -> int:
    data = _json(url, body)
    if isinstance(data, dict) and isinstance(data.get("count"), int):
        return data["count"]
    if isinstance(data, dict) and isinstance(data.get("tokens"), list):
        return len(data["tokens"])
    raise TokenizerError(f"POST {url} answered without 'count' or 'tokens': {body[:200]!r}")

