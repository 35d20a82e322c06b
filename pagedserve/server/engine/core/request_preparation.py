"""A request checked once and given its final parameters before the scheduler sees it.

An ``EngineRequest`` is what a caller hands the engine's door (``LLMEngine.add_requests``,
``AsyncEngine.generate``): the prompt's ids, the parameters as the caller gave them, and
who asks.

``RequestPreparer.prepare`` settles what the engine adds: the ``max_tokens`` default (the
room the prompt leaves), the checkpoint's other end tokens as stop ids, the bad words as
token ids, and every id checked against the vocabulary. It changes nothing and may run in
any thread, so the server prepares large prompts off its event loop. The preparer also
owns what a request's tokens are read with: the end token, and the structured-output
grammar compiler (built on the first structured request).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams, StructuredOutputsParams
from pagedserve.server.engine.core.admissibility import check_context_length
from pagedserve.server.sampling.grammar import GrammarCompiler
from pagedserve.server.sampling.validation import validate_token_ids
from pagedserve.server.tokenizer.base import Tokenizer


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One request through the engine's door. ``prompt``: the prompt's text, when there is
    one (outputs echo it); ``tenant``: whose request it is, for the scheduler's fairness
    between tenants; ``cache_salt``: keeps its prefix-cache blocks apart from others'."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ``RequestPreparer.prepare`` checked, with its final parameters, and the
    compiled grammar of its structured output once compiled (``compile_grammar``): the
    engine's door fills it in before the request is added."""

    prompt_token_ids: list[int]
    params: SamplingParams
    bad_words_token_ids: list[list[int]]
    grammar: Any = None


class RequestPreparer:
    """Checks requests for one model: its tokenizer (None when the engine runs without
    one), ``vocab_size`` rows of logits, the checkpoint's end tokens and its context."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int,
                 eos_token_ids: Sequence[int], max_model_len: int,
                 grammar_cache_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._eos_token_ids = list(eos_token_ids)
        self._grammar_cache_size = grammar_cache_size
        # Built on the first structured request: reading a large vocabulary's bytes takes a
        # moment that a server never asked for structured output should not pay.
        self._grammar_compiler: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's end token, else the checkpoint's first."""
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        return self._eos_token_ids[0] if self._eos_token_ids else None

    def prepare(self, prompt_token_ids: list[int], params: SamplingParams) -> PreparedRequest:
        """The request checked once, with its final parameters. Raises InvalidRequestError
        for a request this model can never serve; the caller's params stay as given (the
        defaults go into a copy). The sampler does not check the ids again."""
        prompt_token_ids = list(prompt_token_ids)
        n_prompt = len(prompt_token_ids)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - n_prompt)
            params = replace(params, max_tokens=max_tokens)
        self._check_prompt_ids(prompt_token_ids)
        extra_eos = self._extra_eos_token_ids(params)
        if extra_eos:
            # Checkpoints with several end tokens (Llama 3): the others stop like stop ids.
            params = replace(params, stop_token_ids=params.stop_token_ids + extra_eos)
        bad_words = self.bad_words_token_ids(params)
        validate_token_ids(params, self.vocab_size, self.eos_token_id, bad_words)
        if params.structured_outputs is not None and self.tokenizer is None:
            raise InvalidRequestError(
                "structured output needs a tokenizer; the server runs without one "
                "(--skip-tokenizer-init)", param=params.structured_outputs.source)
        if params.use_beam_search and params.stop:
            raise InvalidRequestError("stop strings are not supported with beam search",
                                      param="stop")
        check_context_length(n_prompt, max_tokens, self.max_model_len)
        return PreparedRequest(prompt_token_ids, params, bad_words)

    def bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """Each bad word as token ids, alone and after a space (as it appears mid-text)."""
        if not params.bad_words:
            return []
        if self.tokenizer is None:
            raise InvalidRequestError("bad_words needs a tokenizer", param="bad_words")
        sequences = []
        for word in params.bad_words:
            for text in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    def compile_grammar(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of a structured-output constraint, from the bounded cache
        when it was compiled lately; thread-safe. InvalidRequestError names what is wrong
        with an invalid schema, regex or grammar."""
        return self._compiler().compile(spec)

    def _compiler(self) -> GrammarCompiler:
        with self._grammar_lock:
            if self._grammar_compiler is None:
                if self.tokenizer is None:
                    raise InvalidRequestError("structured output needs a tokenizer",
                                              param="structured_outputs")
                stops = [t for t in [self.eos_token_id, *self._eos_token_ids] if t is not None]
                self._grammar_compiler = GrammarCompiler.for_tokenizer(
                    self.tokenizer, self.vocab_size, stops, cache_size=self._grammar_cache_size)
            return self._grammar_compiler

    def _check_prompt_ids(self, prompt_token_ids: list[int]) -> None:
        vocab = self.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"prompt token id {bad[0]} is out of range for a vocabulary of {vocab}",
                param="prompt",
            )

    def _extra_eos_token_ids(self, params: SamplingParams) -> list[int]:
        if params.ignore_eos:
            return []
        primary = self.eos_token_id
        return [t for t in self._eos_token_ids
                if t != primary and t not in params.stop_token_ids]
