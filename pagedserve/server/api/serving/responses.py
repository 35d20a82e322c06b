"""``POST /v1/responses``: one assistant message (and, with tools, the model's function
calls), whole or as OpenAI's stream of typed events.

The conversation goes through the model's chat template, as a chat completion's does, and
tool calls are read out of the output by chat's parsers. A response whose output stopped at
``max_output_tokens`` (or the context's end) is ``"incomplete"`` with reason
``max_output_tokens``, as OpenAI reports it. The stream sends ``response.created`` and
``response.in_progress`` once the request is admitted; without tools it opens the message and
its text part with the first token (so that a client timing the first event with text
measures the real first token), with tools once there is text that is not a call. Then come
each item's events (``responses_output.py``), one delta per step, and ``response.completed``
(or ``response.incomplete``) carrying the whole response. Each event is ``event: TYPE`` and
``data: {json}``, numbered by ``sequence_number``; there is no ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.protocol.responses import ResponsesRequest, parse_responses_request
from pagedserve.server.api.protocol.responses_tools import response_tool_choice, response_tools
from pagedserve.server.api.serving.chat import encode_chat
from pagedserve.server.api.serving.choices import StreamTracker
from pagedserve.server.api.serving.generation import GenerationBatch
from pagedserve.server.api.serving.pipeline import (
    EncodedPrompt,
    Events,
    Route,
    Serving,
    sampling_params,
)
from pagedserve.server.api.serving.responses_output import StreamedOutput, output_items
from pagedserve.server.engine.core.outputs import RequestOutput


class Response(Route[ResponsesRequest]):
    """Engine outputs → Response objects and stream events."""

    id_prefix = "resp"
    response_prefix = "resp_"
    prompt_field = "input"
    typed_events = True

    def __init__(self, serving: Serving, req: ResponsesRequest, params: SamplingParams,
                 prompts: list[EncodedPrompt], response_id: str) -> None:
        super().__init__(serving, req, params, prompts, response_id)
        self.tool_parser = None if req.tools is None else serving.model_tools().parser(
            req.tools)
        self._sequence = 0

    @classmethod
    def parse(cls, body: Any) -> ResponsesRequest:
        return parse_responses_request(body)

    @classmethod
    def prepare(cls, serving: Serving, req: ResponsesRequest) -> None:
        serving.model_tools().apply(req)

    @classmethod
    def params_of(cls, req: ResponsesRequest) -> SamplingParams:
        return sampling_params(req.sampling, max_tokens=req.max_output_tokens, logprobs=None)

    @classmethod
    def encode(cls, serving: Serving, req: ResponsesRequest) -> list[EncodedPrompt]:
        return [EncodedPrompt(*encode_chat(serving, req.messages, req.rendering))]

    def response(self, final: RequestOutput | None,
                 items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The Response object: in progress (no output yet) or final (its output ``items``
        as streamed, or read from the final text)."""
        tools = self.req.tools
        body = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": self.req.instructions,
            "max_output_tokens": self.req.max_output_tokens,
            "model": self.serving.model_name,
            "output": [],
            "parallel_tool_calls": True if tools is None else tools.parallel,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": self.params.temperature,
            "text": {"format": self.req.text_format},
            "tool_choice": response_tool_choice(tools),
            "tools": response_tools(tools),
            "top_p": self.params.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": self.req.metadata,
        }
        if final is None:
            return body
        (output,) = final.outputs
        status = _status(final)
        body["status"] = status
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["output"] = items if items is not None else output_items(
            output.text, self.tool_parser, status)
        body["usage"] = _usage(len(final.prompt_token_ids), len(output.token_ids),
                               final.num_cached_tokens)
        return body

    def body(self, finals: list[RequestOutput]) -> dict[str, Any]:
        (final,) = finals
        return self.response(final)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    async def stream(self, batch: GenerationBatch) -> Events:
        started = self.response(None)
        yield [self._event("response.created", response=started),
               self._event("response.in_progress", response=started)]
        tracker = StreamTracker(1)
        items = StreamedOutput(self._event)
        calls = None if self.tool_parser is None else self.tool_parser.stream()
        final = None
        async for _, output in batch.outputs():
            events = []
            for delta in tracker.deltas(0, output):
                if calls is None:
                    events += items.text(delta.text)
                    continue
                text, pieces = calls.feed(delta.text, delta.finish_reason is not None)
                if text:
                    events += items.text(text)
                for piece in pieces:
                    events += items.call(piece)
            final = output
            yield events
        if final is not None:
            status = _status(final)
            events = items.finish(status)
            response = self.response(final, items.items)
            yield [*events, self._event(f"response.{status}", response=response)]


def _status(final: RequestOutput) -> str:
    return "incomplete" if final.outputs[0].finish_reason == "length" else "completed"


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


create_response = Response.handle
