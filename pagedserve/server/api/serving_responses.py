"""``POST /v1/responses``: one assistant message, whole or as OpenAI's stream of typed events.

The conversation goes through the model's chat template, as a chat completion's does. A
response whose output stopped at ``max_output_tokens`` (or the context's end) is
``"incomplete"`` with reason ``max_output_tokens``, as OpenAI reports it. The stream sends
``response.created`` and ``response.in_progress`` once the request is admitted, opens the
message and its text part with the first token (so that a client timing the first event
with text measures the real first token), then one ``response.output_text.delta`` per
step, the ``done`` events, and ``response.completed`` (or ``response.incomplete``) carrying
the whole response. Each event is ``event: TYPE`` and ``data: {json}``, numbered by
``sequence_number``; there is no ``[DONE]``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from pagedserve.server.api.generation import GenerationBatch
from pagedserve.server.api.jsonio import json_response, read_request
from pagedserve.server.api.limits import check_prompt_tokens
from pagedserve.server.api.protocol_chat import ChatRendering
from pagedserve.server.api.protocol_responses import ResponsesRequest, parse_responses_request
from pagedserve.server.api.serving_chat import encode_chat
from pagedserve.server.api.serving_common import (
    Serving,
    StreamTracker,
    new_request_id,
    now_seconds,
    response_id,
    sampling_params,
)
from pagedserve.server.api.sse import stream_typed_events
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.request_preparation import PreparedRequest
from pagedserve.server.sampling_params import SamplingParams


async def create_response(request: web.Request) -> web.StreamResponse:
    req = await read_request(request, parse_responses_request)
    serving = Serving.of(request)
    serving.check_model(req.model)
    params = sampling_params(req.sampling, max_tokens=req.max_output_tokens, logprobs=None)

    def encode_and_prepare() -> tuple[str, PreparedRequest]:
        text, token_ids = encode_chat(serving, req.messages, ChatRendering())
        # Off the loop for a large body, and once: the engine takes the prepared request.
        return text, serving.engine.prepare_request(token_ids, params)

    text, prepared = await serving.tokenization(request, encode_and_prepare)
    check_prompt_tokens(serving.limits, len(prepared.prompt_token_ids), "input")
    grammar = await serving.engine.compile_grammar(params)
    view = _ResponseView(serving, req, params, response_id(request, "resp_", req.request_id))
    async with serving.batch() as batch:
        batch.add(new_request_id("resp"), prepared, params, text, grammar=grammar)
        if req.stream:
            await batch.admitted()
            return await stream_typed_events(request, view.stream(batch))
        (final,) = await batch.final_outputs()
    return json_response(view.response(final))


class _ResponseView:
    """Engine outputs → Response objects and stream events."""

    def __init__(self, serving: Serving, req: ResponsesRequest, params: SamplingParams,
                 response_id: str):
        self.serving = serving
        self.req = req
        self.params = params
        self.response_id = response_id
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = now_seconds()
        self._sequence = 0

    def response(self, final: RequestOutput | None) -> dict[str, Any]:
        """The Response object: in progress (no output yet) or final."""
        body = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": self.req.instructions,
            "max_output_tokens": self.req.max_output_tokens,
            "model": self.serving.model_name,
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": self.params.temperature,
            "text": {"format": self.req.text_format},
            "tool_choice": "auto",
            "tools": [],
            "top_p": self.params.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": self.req.metadata,
        }
        if final is None:
            return body
        (output,) = final.outputs
        incomplete = output.finish_reason == "length"
        body["status"] = "incomplete" if incomplete else "completed"
        if incomplete:
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["output"] = [self._message(output.text, "incomplete" if incomplete else
                                        "completed")]
        body["usage"] = _usage(len(final.prompt_token_ids), len(output.token_ids),
                               final.num_cached_tokens)
        return body

    def _message(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_text_part(text)]
        return {"type": "message", "id": self.message_id, "status": status,
                "role": "assistant", "content": content}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _text_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self._event(kind, item_id=self.message_id, output_index=0, content_index=0,
                           **fields)

    async def stream(self, batch: GenerationBatch) -> AsyncIterator[list[dict[str, Any]]]:
        started = self.response(None)
        yield [self._event("response.created", response=started),
               self._event("response.in_progress", response=started)]
        tracker = StreamTracker(1)
        final = None
        async for _, output in batch.outputs():
            events = []
            for delta in tracker.deltas(0, output):
                if delta.first:
                    events += [
                        self._event("response.output_item.added", output_index=0,
                                    item=self._message(None, "in_progress")),
                        self._text_event("response.content_part.added",
                                         part=_text_part("")),
                    ]
                if delta.text:
                    events.append(self._text_event("response.output_text.delta",
                                                   delta=delta.text, logprobs=[]))
            final = output
            yield events
        if final is not None:
            yield self._closing_events(final)

    def _closing_events(self, final: RequestOutput) -> list[dict[str, Any]]:
        response = self.response(final)
        (message,) = response["output"]
        text = final.outputs[0].text
        opening = []
        if not final.outputs[0].token_ids:  # no token came (nothing was opened yet)
            opening = [self._event("response.output_item.added", output_index=0,
                                   item=self._message(None, "in_progress")),
                       self._text_event("response.content_part.added", part=_text_part(""))]
        return [
            *opening,
            self._text_event("response.output_text.done", text=text, logprobs=[]),
            self._text_event("response.content_part.done", part=_text_part(text)),
            self._event("response.output_item.done", output_index=0, item=message),
            self._event(f"response.{response['status']}", response=response),
        ]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}
