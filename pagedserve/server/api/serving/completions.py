"""``POST /v1/completions``: one engine request per prompt, n choices each."""

from __future__ import annotations

from typing import Any

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.http.limits import check_prompts
from pagedserve.server.api.protocol.completions import (
    CompletionRequest,
    PromptInput,
    parse_completion_request,
)
from pagedserve.server.api.protocol.prompt import PromptEncoding
from pagedserve.server.api.serving.choices import StreamTracker, new_logprobs, usage
from pagedserve.server.api.serving.generation import GenerationBatch
from pagedserve.server.api.serving.logprobs import CompletionLogprobs, vllm_prompt_logprobs
from pagedserve.server.api.serving.pipeline import (
    EncodedPrompt,
    Events,
    Route,
    Serving,
    reject_unstreamable,
    sampling_params,
)
from pagedserve.server.engine.core.outputs import PositionLogprobs, RequestOutput

OBJECT = "text_completion"


class Completion(Route[CompletionRequest]):
    """Engine outputs → OpenAI completion objects (whole, or chunk by chunk)."""

    id_prefix = "cmpl"
    response_prefix = "cmpl-"
    prompt_field = "prompt"
    numbered = True  # one engine request per prompt

    def __init__(self, serving: Serving, req: CompletionRequest, params: SamplingParams,
                 prompts: list[EncodedPrompt], response_id: str) -> None:
        super().__init__(serving, req, params, prompts, response_id)
        self._head = self.envelope(OBJECT)
        self._logprobs: dict[int, CompletionLogprobs] = {}

    @classmethod
    def parse(cls, body: Any) -> CompletionRequest:
        return parse_completion_request(body)

    @classmethod
    def params_of(cls, req: CompletionRequest) -> SamplingParams:
        prompt_logprobs = req.sampling.pop("prompt_logprobs", None)
        if req.echo and req.logprobs is not None:
            # echo shows the prompt's tokens too, so their logprobs are needed.
            prompt_logprobs = max(req.logprobs, prompt_logprobs or 0)
        return sampling_params(req.sampling, max_tokens=req.max_tokens, logprobs=req.logprobs,
                               prompt_logprobs=prompt_logprobs)

    @classmethod
    def check(cls, serving: Serving, req: CompletionRequest, params: SamplingParams) -> None:
        check_prompts(serving.limits, len(req.prompts), params.num_samples)
        if req.stream:
            reject_unstreamable(params)

    @classmethod
    def encode(cls, serving: Serving, req: CompletionRequest) -> list[EncodedPrompt]:
        return [_encode(serving, p, req.echo, req.encoding) for p in req.prompts]

    def body(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices = []
        for i, final in enumerate(finals):
            for o in final.outputs:
                delta_logprobs = new_logprobs(o, 0)
                choice = self._choice(i * self.params.n + o.index, i, final, o.text,
                                      o.token_ids, delta_logprobs, first=True)
                choice["finish_reason"] = o.finish_reason
                choice["stop_reason"] = o.stop_reason
                choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        return {**self._head, "choices": choices, "usage": usage(finals)}

    async def stream(self, batch: GenerationBatch) -> Events:
        tracker = StreamTracker(self.params.n)
        usage_field = {"usage": None} if self.req.include_usage else {}
        async for i, output in batch.outputs():
            chunks = []
            for d in tracker.deltas(i, output):
                choice = self._choice(d.index, i, output, d.text, d.token_ids, d.logprobs,
                                      d.first)
                choice["finish_reason"] = d.finish_reason
                choice["stop_reason"] = d.stop_reason
                chunk = {**self._head, "choices": [choice], **usage_field}
                if self.req.continuous_usage:
                    chunk["usage"] = tracker.choice_usage(d.index)
                chunks.append(chunk)
            yield chunks
        if self.req.include_usage:
            yield [{**self._head, "choices": [], "usage": tracker.usage()}]

    def _choice(self, index: int, prompt_index: int, output: RequestOutput, text: str,
                token_ids: list[int], logprobs: list[PositionLogprobs | None] | None,
                first: bool) -> dict[str, Any]:
        echo = self.req.echo and first
        prompt = self.prompts[prompt_index]
        choice: dict[str, Any] = {
            "index": index,
            "text": (prompt.text or "") + text if echo else text,
            "logprobs": None,
        }
        if self.req.logprobs is not None:
            choice["logprobs"] = self._logprobs_for(index, output, token_ids, logprobs or [],
                                                   echo)
        if first and self.params.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(self.serving.engine.tokenizer,
                                                           output.prompt_logprobs,
                                                           self.req.tokens_as_ids)
        return choice

    def _logprobs_for(self, index: int, output: RequestOutput, token_ids: list[int],
                      positions: list[PositionLogprobs | None], echo: bool) -> dict[str, Any]:
        builder = self._logprobs.get(index)
        if builder is None:
            builder = CompletionLogprobs(self.serving.tokenizer, 0,
                                         self.params.skip_special_tokens,
                                         self.req.tokens_as_ids)
            self._logprobs[index] = builder
        if echo:
            prompt_positions = output.prompt_logprobs or [None] * len(output.prompt_token_ids)
            token_ids = output.prompt_token_ids + token_ids
            positions = list(prompt_positions) + positions
        return builder.extend(token_ids, positions)



def _encode(serving: Serving, prompt: PromptInput, need_text: bool,
            encoding: PromptEncoding) -> EncodedPrompt:
    """A prompt as the engine takes it, and its text for ``echo``."""
    ids = (serving.tokenizer.encode(prompt, add_special_tokens=encoding.add_special_tokens)
           if isinstance(prompt, str) else prompt)
    token_ids = encoding.truncate(ids, serving.engine.max_model_len)
    if isinstance(prompt, str) and len(token_ids) == len(ids):
        return EncodedPrompt(prompt, token_ids)
    # Token ids, or what truncation left: its text only where echo needs it.
    return EncodedPrompt(serving.tokenizer.decode(token_ids) if need_text else None, token_ids)


create_completion = Completion.handle
