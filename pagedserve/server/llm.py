"""Offline inference: ``LLM(model).generate(prompts, SamplingParams(...))``, as in vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import BeamSearchParams, SamplingParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.request_preparation import EngineRequest
from pagedserve.server.engine.llm_engine import LLMEngine
from pagedserve.server.tokenizer.base import Tokenizer


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


PromptType = str | TokensPrompt


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: prompt + generated tokens, its text, its summed logprob and its score."""

    tokens: list[int]
    text: str
    cum_logprob: float
    score: float
    finish_reason: str | None


@dataclass(slots=True)
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]

    @classmethod
    def of(cls, result: RequestOutput, length_penalty: float) -> BeamSearchOutput:
        return cls([
            BeamSearchSequence(
                tokens=result.prompt_token_ids + c.token_ids,
                text=c.text,
                cum_logprob=c.cumulative_logprob or 0.0,  # a beam always has one
                score=(c.cumulative_logprob or 0.0) / max(1, len(c.token_ids)) ** length_penalty,
                finish_reason=c.finish_reason,
            )
            for c in result.outputs
        ])


class LLM:
    """A model loaded with its paged KV cache; ``generate`` runs prompts to completion.

    Engine arguments take vLLM's names (``block_size``, ``swap_space``,
    ``enable_prefix_caching``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``max_model_len``, ``preemption_mode``, ``dtype``, ``seed``) plus ``num_kv_blocks`` or
    ``kv_cache_memory`` for sizing and ``kv_allocation`` (``paged`` | ``contiguous``).
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineArgs.from_kwargs(model, **engine_args))
        self._request_ids = itertools.count()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(args)
        llm._request_ids = itertools.count()
        return llm

    def get_tokenizer(self) -> Tokenizer | None:
        """The model's tokenizer; None when built with ``skip_tokenizer_init``."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion; results in the order of ``prompts``."""
        prompt_list = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        params_list = self._params_for(prompt_list, sampling_params)
        requests = []
        for prompt, params in zip(prompt_list, params_list):
            text, token_ids = self._tokenize(prompt)
            requests.append(EngineRequest(str(next(self._request_ids)), token_ids, params,
                                          prompt=text))
        self.engine.add_requests(requests)
        return self._run([request.request_id for request in requests])

    def beam_search(self, prompts: PromptType | Sequence[PromptType],
                    params: BeamSearchParams) -> list[BeamSearchOutput]:
        """The ``beam_width`` best continuations of each prompt, best first (transformers'
        ranking: cumulative logprob / generated length ** length_penalty)."""
        sampling = params.to_sampling_params()
        results = self.generate(prompts, sampling)
        return [BeamSearchOutput.of(result, params.length_penalty) for result in results]

    def _run(self, order: list[str]) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    done[output.request_id] = output
        return [done[request_id] for request_id in order]

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.engine.tokenizer is None:
                raise InvalidRequestError("a text prompt needs a tokenizer; this LLM was built "
                                          "with skip_tokenizer_init", param="prompt")
            return prompt, self.engine.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return None, [int(t) for t in prompt["prompt_token_ids"]]
        raise InvalidRequestError(
            f"a prompt must be a string or {{'prompt_token_ids': [...]}}, got {prompt!r:.80}",
            param="prompt",
        )

    @staticmethod
    def _params_for(prompts: list[PromptType],
                    params: SamplingParams | Sequence[SamplingParams] | None
                    ) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams() for _ in prompts]
        if isinstance(params, SamplingParams):
            return [params] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise InvalidRequestError(
                f"got {len(params)} sampling params for {len(prompts)} prompts",
                param="sampling_params",
            )
        return params
