"""Counting with a local Hugging Face tokenizer directory (``--tokenizer /path/to/model``).

The directory holds ``tokenizer.json`` (read with the ``tokenizers`` library, so no
transformers or torch) and, usually, ``tokenizer_config.json`` with the special tokens and
the chat template (or the template in ``chat_template.jinja``). A text is counted as
``tokenizer(text).input_ids`` counts it in transformers: special tokens such as BOS included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from pagedserve.loadgen.bench_errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"


def is_tokenizer_dir(name: str) -> bool:
    return (Path(name) / TOKENIZER_FILE).is_file()


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
    return config if isinstance(config, dict) else {}


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str):
        return template
    jinja_file = directory / "chat_template.jinja"
    return jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None


class HFTokenizerCounter:
    """Counts with ``tokenizer.json``; formats a chat with the directory's chat template."""

    def __init__(self, directory: str) -> None:
        path = Path(directory)
        try:
            self._tokenizer = Tokenizer.from_file(str(path / TOKENIZER_FILE))
        except Exception as exc:  # the library raises a bare Exception for a bad file
            raise TokenizerError(f"cannot load {path / TOKENIZER_FILE}: {exc}") from exc
        config = _read_config(path)
        self._special = {name: _token_text(config.get(name))
                         for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
        source = _chat_template(path, config)
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = _raise
        self._template = environment.from_string(source) if source is not None else None
        self.name = str(path)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def count_sync(self, texts: Sequence[str]) -> list[int]:
        return [len(encoding.ids) for encoding in
                self._tokenizer.encode_batch(list(texts), add_special_tokens=True)]

    async def count(self, texts: Sequence[str]) -> list[int]:
        return self.count_sync(texts)

    async def tokens(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    async def decode(self, token_lists: Sequence[Sequence[int]]) -> list[str]:
        return self._tokenizer.decode_batch([list(ids) for ids in token_lists],
                                            skip_special_tokens=False)

    def format_chat(self, content: str) -> str:
        """One user message through the chat template, with the generation prompt."""
        if self._template is None:
            return content
        messages = [{"role": "user", "content": content}]
        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         **self._special)
        except TemplateError as exc:
            raise TokenizerError(f"the chat template of {self.name} failed: {exc}") from exc
