"""What the completions and chat handlers share: body parsing, the model check, prompt
encoding, per-request sampling params, and the bookkeeping that turns cumulative engine
outputs into per-choice deltas and usage."""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.config.app_keys import CONFIG_KEY, ENGINE_KEY, MODEL_NAMES_KEY
from pagedserve.server.api.http.admission import TENANT
from pagedserve.server.api.http.api_errors import invalid_request, model_not_found
from pagedserve.server.api.http.jsonio import off_loop
from pagedserve.server.api.http.limits import ServerLimits
from pagedserve.server.api.serving.generation import BATCHES_KEY, GenerationBatch
from pagedserve.server.api.telemetry.metrics import METRICS_KEY
from pagedserve.server.api.telemetry.tracing import TRACING_KEY
from pagedserve.server.api.tools.parsers import TOOL_PARSERS, ToolParser
from pagedserve.server.engine.core.outputs import CompletionOutput, PositionLogprobs, RequestOutput

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import AsyncEngine
    from pagedserve.server.tokenizer.base import Tokenizer

try:
    VERSION = importlib.metadata.version("pagedserve")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "0.0.0"
SYSTEM_FINGERPRINT = f"fp_pagedserve_{VERSION}"
T = TypeVar("T")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def response_id(request: web.Request, prefix: str, body_id: str | None) -> str:
    """The id a response carries, as vLLM names it: ``PREFIX`` and the ``X-Request-Id``
    header, else the body's ``request_id``, else a fresh one. The engine's own request ids
    stay fresh, so two requests naming the same id do not collide."""
    client_id = request.headers.get("X-Request-Id") or body_id
    return f"{prefix}{client_id}" if client_id else f"{prefix}{uuid.uuid4().hex}"


@dataclass(slots=True)
class Serving:
    """The application state a generation handler needs."""

    engine: AsyncEngine
    model_names: list[str]
    app: web.Application
    tenant: str | None = None  # whose request: the scheduler is fair between tenants

    @classmethod
    def of(cls, request: web.Request) -> Serving:
        app = request.app
        return cls(app[ENGINE_KEY], app[MODEL_NAMES_KEY], app, request.get(TENANT))

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise model_not_found(model)

    @property
    def tokenizer(self) -> Tokenizer:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise invalid_request(
                "the server runs without a tokenizer (--skip-tokenizer-init): only "
                "completions with token-id prompts and no logprobs or echo are served"
            )
        return tokenizer

    @property
    def limits(self) -> ServerLimits:
        return self.app[CONFIG_KEY].limits

    async def tokenization(self, request: web.Request, work: Callable[[], T]) -> T:
        """``work()`` (tokenizing the request's inputs): inline for a small body, in the
        tokenizer pool for a large one, so the event loop keeps answering meanwhile."""
        return await off_loop(request, request.content_length, work)

    def tool_parser(self) -> ToolParser:
        """The parser ``--tool-call-parser`` names, for ``tool_choice: "auto"``."""
        return TOOL_PARSERS[self.app[CONFIG_KEY].tool_call_parser]()

    def batch(self) -> GenerationBatch:
        return GenerationBatch(self.engine, self.app[BATCHES_KEY], self.app[METRICS_KEY],
                               self.app.get(TRACING_KEY), self.model_name, self.tenant)

    def envelope(self, request_id: str, created: int, kind: str) -> dict[str, Any]:
        """The fields every response object starts with."""
        return {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": self.model_name,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


def now_seconds() -> int:
    return int(time.time())


def sampling_params(sampling: dict[str, Any], max_tokens: int | None, logprobs: int | None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """Validated params (InvalidRequestError names the parameter). ``max_tokens=None``
    lets the engine fill in what the context leaves after the prompt."""
    return SamplingParams(**sampling, max_tokens=max_tokens, logprobs=logprobs,
                          prompt_logprobs=prompt_logprobs)


def reject_unstreamable(params: SamplingParams) -> None:
    """Beam search and best_of pick their outputs only at the end: nothing to stream."""
    if params.use_beam_search:
        raise invalid_request("use_beam_search cannot be combined with stream",
                              param="stream")
    if params.best_of != params.n:
        raise invalid_request(
            f"best_of ({params.best_of}) different from n ({params.n}) cannot be combined "
            f"with stream", param="stream",
        )


def new_logprobs(output: CompletionOutput, start: int) -> list[PositionLogprobs | None] | None:
    """The logprobs of tokens ``start:`` of ``output`` (the engine's list may run ahead)."""
    if output.logprobs is None:
        return None
    return list(output.logprobs[start : len(output.token_ids)])


def usage(finals: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(f.prompt_token_ids) for f in finals)
    completion = sum(len(o.token_ids) for f in finals for o in f.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice gained since it was last sent."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs | None] | None
    finish_reason: str | None
    stop_reason: int | str | None
    first: bool


@dataclass(slots=True)
class _Sent:
    text_len: int = 0
    num_tokens: int = 0
    finished: bool = False


@dataclass(slots=True)
class StreamTracker:
    """Per-choice progress of a stream; choice index = prompt index · n + output index."""

    n: int
    _sent: dict[int, _Sent] = field(default_factory=dict)
    _prompt_tokens: dict[int, int] = field(default_factory=dict)

    def deltas(self, prompt_index: int, output: RequestOutput) -> list[ChoiceDelta]:
        self._prompt_tokens[prompt_index] = len(output.prompt_token_ids)
        deltas = []
        for o in output.outputs:
            index = prompt_index * self.n + o.index
            sent = self._sent.setdefault(index, _Sent())
            grew = len(o.token_ids) > sent.num_tokens or len(o.text) > sent.text_len
            if sent.finished or not (grew or o.finished):
                continue
            deltas.append(ChoiceDelta(
                index=index,
                text=o.text[sent.text_len:],
                token_ids=o.token_ids[sent.num_tokens:],
                logprobs=new_logprobs(o, sent.num_tokens),
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                first=sent.num_tokens == 0 and sent.text_len == 0,
            ))
            sent.text_len, sent.num_tokens = len(o.text), len(o.token_ids)
            sent.finished = o.finished
        return deltas

    def usage(self) -> dict[str, int]:
        prompt = sum(self._prompt_tokens.values())
        completion = sum(s.num_tokens for s in self._sent.values())
        return _usage(prompt, completion)

    def choice_usage(self, index: int) -> dict[str, int]:
        """One choice's usage so far (vLLM's ``continuous_usage_stats``): its prompt, its
        tokens."""
        return _usage(self._prompt_tokens[index // self.n], self._sent[index].num_tokens)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}
