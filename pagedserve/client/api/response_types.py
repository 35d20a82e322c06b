"""Typed views of ``POST /v1/responses`` answers and of the typed events of its stream.

As in ``types``, each keeps the JSON it was parsed from in ``raw``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict

from pagedserve.client.api.client_errors import APIStreamError
from pagedserve.client.api.types import Usage, require_field


@dataclass(slots=True, frozen=True)
class Response:
    """The answer of ``POST /v1/responses``: its text (the ``output_text`` parts of its
    messages) and its usage in ``Usage``'s names (input → prompt, output → completion)."""

    id: str
    model: str
    created_at: int
    status: str
    output_text: str
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    response_headers: Mapping[str, str] = field(
        default_factory=CIMultiDict, repr=False, compare=False
    )

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], response_headers: Mapping[str, str] | None = None
    ) -> Response:
        status = require_field(data, "status", "response")
        text = "".join(part["text"] for item in require_field(data, "output", "response")
                       if item.get("type") == "message" for part in item.get("content") or []
                       if part.get("type") == "output_text")
        usage = data.get("usage")
        return cls(
            id=str(data.get("id", "")),
            model=str(data.get("model", "")),
            created_at=int(data.get("created_at") or 0),
            status=str(status),
            output_text=text,
            usage=Usage.from_dict(usage and {"prompt_tokens": usage.get("input_tokens"),
                                             "completion_tokens": usage.get("output_tokens"),
                                             "total_tokens": usage.get("total_tokens")}),
            raw=data,
            response_headers=CIMultiDict(response_headers or {}),
        )


@dataclass(slots=True, frozen=True)
class ResponseStreamEvent:
    """One event of a Responses stream: its ``type`` (``response.output_text.delta``, ...),
    its ``sequence_number``, the text ``delta`` of a delta event, and the ``response`` of the
    first and last events. An ``error`` event raises ``APIStreamError`` instead."""

    type: str
    sequence_number: int
    delta: str | None
    response: Response | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResponseStreamEvent:
        kind = str(require_field(data, "type", "response stream event"))
        if kind == "error":
            raise APIStreamError(str(data.get("message")), body=data)
        response = data.get("response")
        return cls(type=kind, sequence_number=int(data.get("sequence_number") or 0),
                   delta=data.get("delta"),
                   response=Response.from_dict(response) if response else None, raw=data)
