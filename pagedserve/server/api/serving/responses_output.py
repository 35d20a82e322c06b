"""A Response's output items: a ``message`` for the model's text and a ``function_call`` item
per tool call, made whole from the final text or, in a stream, opened and closed one after
another as the text arrives, with the events OpenAI sends for each.

A streamed message opens with ``response.output_item.added`` and
``response.content_part.added``, grows by ``response.output_text.delta`` and closes with
``response.output_text.done``, ``response.content_part.done`` and
``response.output_item.done``; a function call opens with ``response.output_item.added``
(its arguments empty), grows by ``response.function_call_arguments.delta`` and closes with
``response.function_call_arguments.done`` and ``response.output_item.done``. An item closes
when the next one opens or the output ends; only the last can be ``incomplete``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pagedserve.server.api.tools.parsers import ToolCallDelta, ToolParser

Event = Callable[..., dict[str, Any]]  # makes one numbered event of a type and its fields


def output_items(text: str, parser: ToolParser | None, status: str) -> list[dict[str, Any]]:
    """The items of a whole output (``parser`` reads its tool calls, if the request has
    tools); ``status`` is the last item's, the others being complete."""
    content, calls = (text, []) if parser is None else parser.extract(text)
    items = []
    if content is not None or not calls:
        items.append(_message(_message_id(), content or "", "completed"))
    items += [_function_call(call.id, call.name, call.arguments, "completed")
              for call in calls]
    items[-1]["status"] = status
    return items


class StreamedOutput:
    """The items of a streamed output; each method returns the events to send."""

    def __init__(self, event: Event) -> None:
        self.items: list[dict[str, Any]] = []  # closed items
        self._event = event
        self._open: dict[str, Any] | None = None
        self._text = ""  # of the open message

    def text(self, text: str) -> list[dict[str, Any]]:
        """More of the message's text (an empty text opens the message all the same)."""
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close("completed")
            self._open, self._text = _message(_message_id(), None, "in_progress"), ""
            events += [self._added(), self._part_event("response.content_part.added",
                                                       part=_text_part(""))]
        if text:
            self._text += text
            events.append(self._part_event("response.output_text.delta", delta=text,
                                           logprobs=[]))
        return events

    def call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        events = []
        if delta.id is not None:
            events += self._close("completed")
            self._open = _function_call(delta.id, delta.name or "", "", "in_progress")
            events.append(self._added())
        if delta.arguments:
            self._current()["arguments"] += delta.arguments
            events.append(self._item_event("response.function_call_arguments.delta",
                                           delta=delta.arguments))
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Closes the last item (an output with none gets an empty message)."""
        events = self.text("") if self._open is None and not self.items else []
        return events + self._close(status)

    def _close(self, status: str) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        if self._open["type"] == "message":
            part = _text_part(self._text)
            events = [self._part_event("response.output_text.done", text=self._text,
                                       logprobs=[]),
                      self._part_event("response.content_part.done", part=part)]
            item = {**self._open, "status": status, "content": [part]}
        else:
            events = [self._item_event("response.function_call_arguments.done",
                                       arguments=self._open["arguments"])]
            item = {**self._open, "status": status}
        events.append(self._event("response.output_item.done",
                                  output_index=len(self.items), item=item))
        self.items.append(item)
        self._open = None
        return events

    def _added(self) -> dict[str, Any]:
        return self._event("response.output_item.added", output_index=len(self.items),
                           item=dict(self._current()))

    def _item_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self._event(kind, item_id=self._current()["id"], output_index=len(self.items),
                           **fields)

    def _current(self) -> dict[str, Any]:
        """The item being streamed; a call's pieces start with its id, which opens it."""
        if self._open is None:
            raise RuntimeError("no output item is open")
        return self._open

    def _part_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self._item_event(kind, content_index=0, **fields)


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def _message(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def _function_call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
