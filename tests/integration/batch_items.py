"""Batch inputs for the live tests and what the offline engine says they must produce.

Items are numbered; every fifth one is a chat request in OpenAI's batch-file format, the rest
plain completions lines. Bodies name no model, so the runner must take it from the server's
``/v1/models``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pagedserve.server import LLM, SamplingParams

WORDS = ("paged", "attention", "stores", "the", "keys", "and", "values", "of", "each",
         "sequence", "in", "blocks", "memory", "is", "allocated", "on", "demand")


@dataclass(slots=True, frozen=True)
class Item:
    custom_id: str
    kind: str  # "completions" | "chat"
    body: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Expected:
    """The offline engine's greedy answer to one item."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def item_id(index: int) -> str:
    return f"item-{index:02d}"


def prompt_text(index: int) -> str:
    words = " ".join(WORDS[(index * 3 + j) % len(WORDS)] for j in range(3 + index % 7))
    return f"Request {index}: {words}"


def make_items(count: int, max_tokens: Callable[[int], int] = lambda _: 8,
               chat_every: int = 5) -> list[Item]:
    """``count`` greedy items; ``max_tokens(index)`` sets each one's answer length."""
    items = []
    for index in range(count):
        body: dict[str, Any] = {"max_tokens": max_tokens(index), "temperature": 0}
        if chat_every and index % chat_every == chat_every - 1:
            body["messages"] = [{"role": "user", "content": prompt_text(index)}]
            items.append(Item(item_id(index), "chat", body))
        else:
            body["prompt"] = prompt_text(index)
            items.append(Item(item_id(index), "completions", body))
    return items


def write_jsonl(path: Path, items: Sequence[Item]) -> Path:
    lines = []
    for item in items:
        if item.kind == "chat":
            record = {"custom_id": item.custom_id, "method": "POST",
                      "url": "/v1/chat/completions", "body": item.body}
        else:
            record = {"id": item.custom_id, **item.body}
        lines.append(orjson.dumps(record))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def prompt_token_ids(offline: LLM, item: Item) -> list[int]:
    """What the server feeds the engine for ``item``: the text with BOS, or the rendered
    chat template as it stands."""
    tokenizer = offline.get_tokenizer()
    if item.kind == "chat":
        text = tokenizer.apply_chat_template(item.body["messages"], add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(item.body["prompt"])


def expected_answers(offline: LLM, items: Sequence[Item]) -> dict[str, Expected]:
    """Each item's greedy answer from the offline engine, by id."""
    prompts = [{"prompt_token_ids": prompt_token_ids(offline, item)} for item in items]
    params = [SamplingParams(temperature=0, max_tokens=item.body["max_tokens"],
                             ignore_eos=bool(item.body.get("ignore_eos")))
              for item in items]
    outputs = offline.generate(prompts, params)
    return {
        item.custom_id: Expected(out.outputs[0].text, len(out.prompt_token_ids),
                                 len(out.outputs[0].token_ids))
        for item, out in zip(items, outputs, strict=True)
    }


def answer_text(kind: str, body: dict[str, Any]) -> str:
    """The generated text of a completions or chat response body."""
    (choice,) = body["choices"]
    return choice["message"]["content"] if kind == "chat" else choice["text"]
