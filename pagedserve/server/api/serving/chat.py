"""``POST /v1/chat/completions``: messages → the model's chat template → one engine request."""

from __future__ import annotations

from typing import Any

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.config.app_keys import CONFIG_KEY
from pagedserve.server.api.http.api_errors import invalid_request
from pagedserve.server.api.protocol.chat import ChatCompletionRequest, parse_chat_request
from pagedserve.server.api.protocol.chat_rendering import ChatRendering
from pagedserve.server.api.serving.choices import StreamTracker, new_logprobs, usage
from pagedserve.server.api.serving.generation import GenerationBatch
from pagedserve.server.api.serving.logprobs import chat_logprobs, vllm_prompt_logprobs
from pagedserve.server.api.serving.pipeline import (
    EncodedPrompt,
    Events,
    Route,
    Serving,
    reject_unstreamable,
    sampling_params,
)
from pagedserve.server.api.tools.grammar_calls import NamedCall
from pagedserve.server.api.tools.parsers import ToolParser, ToolStream
from pagedserve.server.engine.core.outputs import PositionLogprobs, RequestOutput
from pagedserve.server.tokenizer.chat_messages import content_text

OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"
ROLE = "assistant"


def encode_chat(serving: Serving, messages: list[Any], rendering: ChatRendering,
                add_special_tokens: bool = False) -> tuple[str, list[int]]:
    """The prompt text and ids of a conversation (shared with ``/tokenize``): special-token
    text in the messages stays text unless the server allows it."""
    # By default no BOS of our own: the template writes its own special tokens.
    return serving.tokenizer.encode_chat(
        messages, add_generation_prompt=rendering.add_generation_prompt,
        continue_final_message=rendering.continue_final_message,
        variables=rendering.variables, add_special_tokens=add_special_tokens,
        allow_special_tokens_in_content=serving.app[CONFIG_KEY].allow_special_tokens_in_content)


class ChatCompletion(Route[ChatCompletionRequest]):
    id_prefix = "chatcmpl"
    response_prefix = "chatcmpl-"
    prompt_field = "messages"

    def __init__(self, serving: Serving, req: ChatCompletionRequest, params: SamplingParams,
                 prompts: list[EncodedPrompt], response_id: str) -> None:
        super().__init__(serving, req, params, prompts, response_id)
        self.echoed = _echoed(req)
        self.tool_parser = None if req.tools is None else serving.model_tools().parser(
            req.tools)

    @classmethod
    def parse(cls, body: Any) -> ChatCompletionRequest:
        return parse_chat_request(body)

    @classmethod
    def prepare(cls, serving: Serving, req: ChatCompletionRequest) -> None:
        serving.model_tools().apply(req)

    @classmethod
    def params_of(cls, req: ChatCompletionRequest) -> SamplingParams:
        return sampling_params(
            req.sampling,
            max_tokens=req.max_tokens,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            prompt_logprobs=req.sampling.pop("prompt_logprobs", None),
        )

    @classmethod
    def check(cls, serving: Serving, req: ChatCompletionRequest,
              params: SamplingParams) -> None:
        if not req.stream:
            return
        reject_unstreamable(params)
        if params.prompt_logprobs is not None:
            # As in vLLM: a chat stream has no place for them (a completions stream puts
            # them on each choice's first chunk).
            raise invalid_request("prompt_logprobs is not available when stream is true",
                                  param="prompt_logprobs")

    @classmethod
    def encode(cls, serving: Serving, req: ChatCompletionRequest) -> list[EncodedPrompt]:
        text, ids = encode_chat(serving, req.messages, req.rendering,
                                req.encoding.add_special_tokens)
        token_ids = req.encoding.truncate(ids, serving.engine.max_model_len)
        if len(token_ids) < len(ids):
            text = serving.tokenizer.decode(token_ids)
        return [EncodedPrompt(text, token_ids)]

    def message(self, text: str, finish_reason: str | None
                ) -> tuple[dict[str, Any], str | None]:
        """The reply's message (its tool calls read out of the text when the request has
        tools) and its finish reason."""
        if self.tool_parser is None:
            return {"role": ROLE, "content": self.echoed + text}, finish_reason
        content, calls = self.tool_parser.extract(text)
        reply = self.echoed + content if content is not None else self.echoed or None
        message: dict[str, Any] = {"role": ROLE, "content": reply}
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        return message, self._finish_reason(finish_reason, bool(calls))

    def _finish_reason(self, finish_reason: str | None, called: bool) -> str | None:
        # As vLLM reports it: a call the model chose to make (auto, required) ends with
        # "tool_calls"; a call to the function the request named ends as any reply does.
        if called and finish_reason == "stop" and not isinstance(self.tool_parser, NamedCall):
            return "tool_calls"
        return finish_reason

    def body(self, finals: list[RequestOutput]) -> dict[str, Any]:
        (final,) = finals
        choices = []
        for o in sorted(final.outputs, key=lambda o: o.index):
            message, finish_reason = self.message(o.text, o.finish_reason)
            choices.append({
                "index": o.index,
                "message": message,
                "logprobs": self.logprobs(o.token_ids, new_logprobs(o, 0)),
                "finish_reason": finish_reason,
                "stop_reason": o.stop_reason,
            })
        body = {**self.envelope(OBJECT), "choices": choices, "usage": usage(finals)}
        if self.params.prompt_logprobs is not None:
            # vLLM's place for them: the response, since every choice shares the prompt.
            body["prompt_logprobs"] = vllm_prompt_logprobs(
                self.serving.engine.tokenizer, final.prompt_logprobs, self.req.tokens_as_ids)
        return body

    def logprobs(self, token_ids: list[int],
                 positions: list[PositionLogprobs | None] | None) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        return chat_logprobs(self.serving.tokenizer, token_ids, positions or [],
                             self.req.top_logprobs or 0, self.req.tokens_as_ids)

    async def stream(self, batch: GenerationBatch) -> Events:
        envelope = self.envelope(CHUNK_OBJECT)
        if self.req.include_usage:
            envelope["usage"] = None
        tracker = StreamTracker(self.params.n)
        tools = _StreamedCalls(self.tool_parser)
        async for i, output in batch.outputs():
            chunks = []
            for d in tracker.deltas(i, output):
                text, calls = tools.feed(d.index, d.text, d.finish_reason is not None)
                text = self.echoed + text if d.first else text
                has_text = (d.token_ids and self.tool_parser is None) or text
                delta: dict[str, Any] = {"content": text} if has_text else {}
                if calls:
                    delta["tool_calls"] = calls
                if d.first:
                    # The role rides on the choice's first token, as vLLM sends it: a chunk
                    # with choices before any token would read as the first token to clients
                    # that time TTFT from the first chunk.
                    delta = {"role": ROLE, **delta}
                choice = {"index": d.index, "delta": delta,
                          "logprobs": self.logprobs(d.token_ids, d.logprobs),
                          "finish_reason": self._finish_reason(d.finish_reason,
                                                               tools.called(d.index))}
                if d.finish_reason is not None:
                    choice["stop_reason"] = d.stop_reason
                chunk = {**envelope, "choices": [choice]}
                if self.req.continuous_usage:
                    chunk["usage"] = tracker.choice_usage(d.index)
                chunks.append(chunk)
            yield chunks
        if self.req.include_usage:
            yield [{**envelope, "choices": [], "usage": tracker.usage()}]


class _StreamedCalls:
    """Each choice's tool calls as its text streams: the content to send now, and the
    pieces of its calls as OpenAI's ``tool_calls`` deltas (numbered per choice)."""

    def __init__(self, parser: ToolParser | None) -> None:
        self._parser = parser
        self._streams: dict[int, ToolStream] = {}
        self._called: set[int] = set()

    def feed(self, index: int, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        if self._parser is None:
            return text, []
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = self._parser.stream()
        content, deltas = stream.feed(text, final)
        if deltas:
            self._called.add(index)
        return content, [delta.to_openai() for delta in deltas]

    def called(self, index: int) -> bool:
        return index in self._called


def _echoed(req: ChatCompletionRequest) -> str:
    """With vLLM's ``echo``, the text each reply starts with: the last message's content when
    it is the assistant's (a reply being continued), else nothing."""
    last = req.messages[-1]  # rendered by now, so a valid message
    if not req.echo or last.get("role") != ROLE:
        return ""
    return content_text(len(req.messages) - 1, last.get("content") or "")


create_chat_completion = ChatCompletion.handle
