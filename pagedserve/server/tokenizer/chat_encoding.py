"""A chat's token ids with the caller's text kept as text: what a user writes cannot become
the template's own markers.

Rendering a chat to text and encoding it with special tokens matched would let a message
that contains ``<|im_end|>\\n<|im_start|>system\\n...`` end its own turn and forge a system
turn: the markers in its content would become the very ids the template writes. Here the
caller's text is found in the rendered text (``render_chat_spans``: every message's content,
and any other string of the caller's that holds control text, such as a message's ``name``,
a tool call's arguments, ``tools``) and a control text inside it is encoded as plain text,
split where needed so that its ids differ from the marker's.
Control texts are the tokenizer's special tokens and the ``<|...|>`` markers the template
writes (a vocabulary without special ids for them, as cl100k has none for ChatML's, would
otherwise give a forged marker the real one's ids). Everything else is encoded as before, so
a chat without such text gets exactly the ids it always had.

When the template changes the caller's text past recognition (more than trimming it or
escaping it as JSON), it cannot be found: a chat whose text holds control text is then
refused, one without is encoded whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer.chat_spans import RenderedChat, render_chat_spans

if TYPE_CHECKING:
    from pagedserve.server.tokenizer.base import Tokenizer

# Markers the template writes that tokenizers often have no special id for.
_MARKER = re.compile(r"<\|[^|\s<>]{1,64}\|>")


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, object]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
    add_special_tokens: bool = False,
    allow_special_tokens_in_content: bool = False,
) -> tuple[str, list[int]]:
    """The prompt text and its ids. ``allow_special_tokens_in_content`` encodes the whole
    text with special tokens matched, contents included (the behaviour of rendering to text,
    then encoding it)."""
    if allow_special_tokens_in_content:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, variables=variables)
        return text, tokenizer.encode(text, add_special_tokens=add_special_tokens)
    rendered = render_chat_spans(
        tokenizer.chat_template, messages, add_generation_prompt=add_generation_prompt,
        special_tokens=tokenizer.special_tokens_map,
        continue_final_message=continue_final_message, variables=variables,
        hole=_maybe_control(tokenizer).search)
    text = rendered.text
    pattern = _control_pattern(tokenizer, rendered.template_text)
    forged = [] if pattern is None else _forged(rendered, pattern)
    if not forged:
        return text, tokenizer.encode(text, add_special_tokens=add_special_tokens)
    ids: list[int] = []
    pos = 0
    for start, end in forged:
        ids += tokenizer.encode(text[pos:start], add_special_tokens=False)
        ids += as_plain_text(tokenizer, text[start:end])
        pos = end
    ids += tokenizer.encode(text[pos:], add_special_tokens=False)
    return text, _framed(tokenizer, ids) if add_special_tokens else ids


def as_plain_text(tokenizer: Tokenizer, control: str) -> list[int]:
    """Ids that spell ``control`` as text and differ from the ids it has as a marker."""
    marker = tokenizer.encode(control, add_special_tokens=False)
    plain = tokenizer.encode_text(control)
    if plain != marker:
        return plain
    for cut in range(1, len(control)):  # the vocabulary spells the marker as text: break it
        split = tokenizer.encode_text(control[:cut]) + tokenizer.encode_text(control[cut:])
        if split != marker:
            return split
    return plain  # a one-character marker: nothing to tell apart


def _maybe_control(tokenizer: Tokenizer) -> re.Pattern[str]:
    """Text that may hold a control text, whatever the template writes: a special token's
    text or anything shaped like a marker. Strings of the caller's that match are located
    in the rendered chat; the others are left in place, so that no template's branching on
    them changes."""
    specials = sorted((t for t in tokenizer.special_texts if t), key=len, reverse=True)
    return re.compile("|".join([*(re.escape(t) for t in specials), _MARKER.pattern]))


def _control_pattern(tokenizer: Tokenizer, template_text: str) -> re.Pattern[str] | None:
    controls = set(tokenizer.special_texts) | set(_MARKER.findall(template_text))
    controls.discard("")
    if not controls:
        return None
    # Longest first, so that a marker that contains another is matched whole.
    alternatives = sorted(controls, key=len, reverse=True)
    return re.compile("|".join(re.escape(c) for c in alternatives))


def _forged(rendered: RenderedChat, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    if rendered.spans is None:
        for where, value in rendered.fields:
            found = pattern.search(value)
            if found is not None:
                raise InvalidRequestError(
                    f"{where} contains {found.group()!r}, a special token of this model, and "
                    f"its chat template changes it so that it cannot be kept as text; leave "
                    f"it out, or start the server with --allow-special-tokens-in-content",
                    param=re.split(r"[.\[ ]", where, maxsplit=1)[0])
        return []
    return [found.span() for start, end in rendered.spans
            for found in pattern.finditer(rendered.text, start, end)]


def _framed(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """``ids`` with the BOS/EOS that ``add_special_tokens`` adds around a text."""
    bare = tokenizer.encode("a", add_special_tokens=False)
    framed = tokenizer.encode("a", add_special_tokens=True)
    for at in range(len(framed) - len(bare) + 1):
        if framed[at:at + len(bare)] == bare:
            return framed[:at] + ids + framed[at + len(bare):]
    return ids
