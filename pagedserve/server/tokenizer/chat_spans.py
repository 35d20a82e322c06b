"""Where the request's own text lies in a rendered chat.

The template is rendered twice: once as it is, once with a placeholder (a "hole") in place
of each piece of the caller's text, and the real text is matched against the pieces of the
second rendering around the holes. Every message's content is a hole; so is any other string
the caller sent that ``hole`` picks (a message's ``name``, a tool call's name and arguments,
``tools``, ``documents`` and ``chat_template_kwargs``, keys included), so that the template's
branching is left alone for the strings that do not need it. A hole is found as written,
trimmed (many templates trim contents), or escaped as a JSON string (what ``tojson`` writes
for a string inside ``tools`` or a call's arguments).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pagedserve.server.tokenizer.chat_messages import template_messages
from pagedserve.server.tokenizer.chat_template import render_validated, template_context


@dataclass(frozen=True, slots=True)
class RenderedChat:
    """A rendered prompt and where the caller's text lies in it.

    ``fields`` are the holes: ``(where, text)``, where naming it as a request field
    (``messages[2].content``, ``tools[0].function.description``). ``spans`` are ``(start,
    end)`` offsets into ``text``, in order, one per time the template wrote a hole out; None
    when they cannot be told apart from what the template wrote (a template that changes
    them other than by trimming or JSON escaping). ``template_text`` is what the template
    itself wrote: the text with every hole left out."""

    text: str
    spans: list[tuple[int, int]] | None
    template_text: str
    fields: list[tuple[str, str]]


def render_chat_spans(
    template: str | None,
    messages: object,
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
    hole: Callable[[str], bool] | None = None,
) -> RenderedChat:
    """``render_chat_template``'s text, with the contents (and the other strings of the
    caller's for which ``hole`` is true) located in it."""
    chat = template_messages(messages)
    context = template_context(add_generation_prompt, special_tokens, variables)
    text = render_validated(template, chat, context, continue_final_message)
    holes = _Holes(hole or _never)
    holed_chat = [holes.message(i, m) for i, m in enumerate(chat)]
    holed_variables = {name: holes.value(name, value)
                       for name, value in (variables or {}).items()}
    skeleton = render_validated(template, holed_chat,
                                template_context(add_generation_prompt, special_tokens,
                                                 holed_variables),
                                continue_final_message)
    spans = _locate(text, skeleton, [value for _, value in holes.fields])
    return RenderedChat(text, spans, _HOLE_PATTERN.sub("", skeleton), holes.fields)


# A hole: private-use characters around its index, which no template writes or changes
# (trim, JSON escaping) and no tokenizer treats as special.
_HOLE = "\ue000{}\ue001"
_HOLE_PATTERN = re.compile("\ue000(\\d+)\ue001")


def _never(_: str) -> bool:
    return False


class _Holes:
    """Copies of the caller's values with holes in place of chosen strings; ``fields``
    lists what each hole stands for."""

    def __init__(self, hole: Callable[[str], bool]) -> None:
        self._hole = hole
        self.fields: list[tuple[str, str]] = []

    def message(self, i: int, message: dict[str, Any]) -> dict[str, Any]:
        holed = {}
        for key, value in message.items():
            where = f"messages[{i}].{key}"
            if key == "content":
                holed[key] = self._make(where, value)  # always: contents are free text
            elif key == "role":
                holed[key] = value  # one of ROLES: templates branch on it
            else:
                holed[self.string(f"{where} (a key)", key)] = self.value(where, value)
        return holed

    def value(self, where: str, value: Any) -> Any:
        if isinstance(value, str):
            return self.string(where, value)
        if isinstance(value, Mapping):
            return {self.string(f"{where} (a key)", key) if isinstance(key, str) else key:
                    self.value(f"{where}.{key}", item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.value(f"{where}[{j}]", item) for j, item in enumerate(value)]
        return value

    def string(self, where: str, text: str) -> str:
        return self._make(where, text) if self._hole(text) else text

    def _make(self, where: str, text: str) -> str:
        self.fields.append((where, text))
        return _HOLE.format(len(self.fields) - 1)


def _written_forms(text: str) -> dict[str, None]:
    """How a template may write ``text`` out: as it is, trimmed (Llama 3's and many ChatML
    templates trim contents), or inside a JSON string (``tojson``)."""
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return dict.fromkeys((text, text.strip(), text.lstrip(), text.rstrip(), escaped))


def _locate(text: str, skeleton: str, values: list[str]) -> list[tuple[int, int]] | None:
    parts = _HOLE_PATTERN.split(skeleton)
    pieces, holes = parts[0::2], [int(i) for i in parts[1::2]]
    if not text.startswith(pieces[0]):
        return None
    pos, spans = len(pieces[0]), []
    for index, after in zip(holes, pieces[1:], strict=True):
        for written in _written_forms(values[index]):
            end = pos + len(written)
            if text.startswith(written, pos) and text.startswith(after, end):
                break
        else:
            return None
        spans.append((pos, end))
        pos = end + len(after)
    return spans if pos == len(text) else None
