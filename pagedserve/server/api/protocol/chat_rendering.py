"""How a chat request's messages become a prompt besides the messages themselves: the
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs`` and
``documents`` fields, which chat, responses and ``/tokenize`` share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.fields import Fields, type_error


@dataclass(frozen=True, slots=True)
class ChatRendering:
    """What the chat template gets besides the messages, as in vLLM: how the prompt ends (the
    template's opening of a new assistant turn, ``add_generation_prompt``, on by default; or
    the last message left open for the model to continue, ``continue_final_message``; not
    both), and the template's extra variables: ``chat_template_kwargs`` (say,
    ``{"enable_thinking": false}``) and ``documents``."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    variables: Mapping[str, Any] = field(default_factory=dict)


# Set by the fields of their own names (or, for messages, by nothing else).
_RESERVED_VARIABLES = ("messages", "add_generation_prompt", "continue_final_message",
                       "documents")


def read_chat_rendering(fields: Fields) -> ChatRendering:
    rendering = ChatRendering(fields.boolean("add_generation_prompt", True),
                              fields.boolean("continue_final_message", False),
                              _read_template_variables(fields))
    if rendering.add_generation_prompt and rendering.continue_final_message:
        raise InvalidRequestError("continue_final_message and add_generation_prompt cannot "
                                  "both be true: set add_generation_prompt to false to "
                                  "continue the last message", param="continue_final_message")
    return rendering


def _read_template_variables(fields: Fields) -> dict[str, Any]:
    kwargs = fields.raw("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise type_error("chat_template_kwargs", "an object", kwargs)
    variables = dict(kwargs or {})
    for name in _RESERVED_VARIABLES:
        if name in variables:
            raise InvalidRequestError(f"chat_template_kwargs cannot set {name!r}: it is a "
                                      "field of the request", param="chat_template_kwargs")
    documents = fields.raw("documents")
    if documents is not None:
        if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
            raise type_error("documents", "a list of objects", documents)
        variables["documents"] = documents
    return variables
