"""OpenAI chat messages → the messages chat templates expect.

Templates are written for transformers' ``apply_chat_template`` fed the way vLLM feeds it,
so each message is checked and copied into that form:

- ``role`` is one of ``ROLES``;
- ``content`` is a string: text parts (``{"type": "text", "text": ...}``) are joined with
  newlines, and an assistant's null or absent content (beside ``tool_calls``, or a refusal)
  becomes ``""``, since templates read ``message['content']`` unguarded; every other role
  must send one;
- ``tool_calls`` is a list of ``{"id", "type": "function", "function": {"name",
  "arguments"}}`` whose ``arguments`` is an object, not OpenAI's JSON text: templates write
  them with ``tojson`` (arguments that are not a JSON object stay text);
- every other member (``name``, ``tool_call_id``, ...) is kept as sent, and members whose
  value is null are dropped, as transformers drops them, so that a template's ``is
  defined`` tests read them as absent.

Anything malformed raises ``InvalidRequestError(param="messages")`` naming the member.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from pagedserve.common.engine_errors import InvalidRequestError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

_PARAM = "messages"


def template_messages(messages: object) -> list[dict[str, Any]]:
    """Checked copies of ``messages`` in the form templates expect (see the module)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        _fail(f"messages must be a list, got {type(messages).__name__}")
    if not messages:
        _fail("messages must contain at least one message, got 0")
    return [_template_message(i, message) for i, message in enumerate(messages)]


def _template_message(i: int, message: object) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        _fail(f"messages[{i}] must be an object, got {type(message).__name__}")
    checked = {key: value for key, value in message.items()
               if value is not None or key == "content"}
    if "role" not in checked:
        _fail(f"messages[{i}] is missing 'role'")
    role = checked["role"]
    if not isinstance(role, str) or role not in ROLES:
        _fail(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
    if checked.get("content") is not None:
        checked["content"] = content_text(i, checked["content"])
    elif role == "assistant":
        checked["content"] = ""
    else:
        _fail(f"messages[{i}] is missing 'content'")
    if "tool_calls" in checked:
        if role != "assistant":
            _fail(f"messages[{i}].tool_calls is for assistant messages, got role {role!r}")
        checked["tool_calls"] = [_tool_call(i, j, call)
                                 for j, call in enumerate(_list(i, checked["tool_calls"]))]
    return checked


def content_text(i: int, content: object) -> str:
    """Message ``i``'s content as text: a string as it is, text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _fail(f"messages[{i}].content must be a string or a list of text parts, "
              f"got {type(content).__name__}")
    return "\n".join(_part_text(i, j, part) for j, part in enumerate(content))


def _part_text(i: int, j: int, part: object) -> str:
    where = f"messages[{i}].content[{j}]"
    if not isinstance(part, Mapping):
        _fail(f"{where} must be an object, got {type(part).__name__}")
    if part.get("type") != "text":
        _fail(f"{where}.type must be 'text', got {part.get('type')!r}")
    text = part.get("text")
    if not isinstance(text, str):
        _fail(f"{where}.text must be a string, got {type(text).__name__}")
    return text


def _list(i: int, calls: object) -> list[Any]:
    if not isinstance(calls, list):
        _fail(f"messages[{i}].tool_calls must be a list, got {type(calls).__name__}")
    return calls


def _tool_call(i: int, j: int, call: object) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}]"
    if not isinstance(call, Mapping):
        _fail(f"{where} must be an object, got {type(call).__name__}")
    function = call.get("function")
    if not isinstance(function, Mapping):
        _fail(f"{where}.function must be an object with a name and arguments")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        _fail(f"{where}.function.name must be a non-empty string, got {name!r}")
    checked = {key: value for key, value in call.items() if value is not None}
    checked.setdefault("type", "function")
    checked["function"] = {**{k: v for k, v in function.items() if v is not None},
                           "arguments": _arguments(function.get("arguments"), where)}
    return checked


def _arguments(arguments: object, where: str) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        _fail(f"{where}.function.arguments must be a JSON object's text, "
              f"got {type(arguments).__name__}")
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the template gets the text as it is
    return value if isinstance(value, dict) else arguments


def _fail(message: str) -> NoReturn:
    raise InvalidRequestError(message, param=_PARAM)
