"""The prefix policy's routing key: the chained block hash of a prompt's leading blocks.

The router does not tokenize. Asking a replica's ``/tokenize`` would add a round trip to every
request, and loading the tokenizer here would tie the router to one model. Text is instead cut
into blocks of ``block_chars`` characters and hashed with the prefix cache's own block hash,
treating code points as ids: two prompts with the same leading text share the same leading
tokens, so they share the key, and that is all routing needs. Prompts sent as token ids are
hashed exactly as the replica's prefix cache hashes them.
"""

from __future__ import annotations

from typing import Any

from pagedserve.common.block_hash import hash_block_tokens, hash_prefix_blocks


def prompt_units(path: str, body: dict[str, Any]) -> tuple[list[int], bool]:
    """The prompt as a list of units, and whether they are token ids (else code points)."""
    if path.endswith("/chat/completions"):
        return _code_points(_messages_text(body.get("messages"))), False
    if path.endswith("/responses"):
        text = _text(body.get("instructions")) + _input_text(body.get("input"))
        return _code_points(text), False
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of prompts goes where its first one is cached
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt), True
    return _code_points(_text(prompt)), False


def routing_key(path: str, body: dict[str, Any], prefix_blocks: int, block_chars: int,
                block_size: int) -> bytes:
    """A digest that two prompts share when their first ``prefix_blocks`` blocks match."""
    units, are_tokens = prompt_units(path, body)
    size = block_size if are_tokens else block_chars
    hashes = hash_prefix_blocks(units, size, prefix_blocks)
    if hashes:
        return hashes[-1].hash_value
    # Shorter than one block: the whole prompt is the key.
    return hash_block_tokens(None, units).hash_value


def _code_points(text: str) -> list[int]:
    return [ord(c) for c in text]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(part.get("text")) for part in content if isinstance(part, dict))
    return ""


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    return "".join(f"{_text(m.get('role'))}\n{_content_text(m.get('content'))}\n"
                   for m in messages if isinstance(m, dict))


def _input_text(value: Any) -> str:
    if isinstance(value, list):
        return _messages_text(value)
    return _text(value)
