"""The pipeline every generation route runs (``Route.handle``): read and check the body,
check the model, let the route prepare the request (a chat's tools, in the model's tool
format), build the sampling params, encode the prompts (off the event loop for a
large body), check the server's token limit, hand the prompts to the engine's door, then
stream the outputs or collect them. A route adds only its protocol: its body, its params
and refusals, its prompts, and the view that shapes engine outputs into its responses."""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from aiohttp import web

from pagedserve.common.load_hints import HEADER_KEEPALIVE
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.config.app_keys import CONFIG_KEY, ENGINE_KEY, MODEL_NAMES_KEY
from pagedserve.server.api.http.admission import TENANT
from pagedserve.server.api.http.api_errors import invalid_request, model_not_found
from pagedserve.server.api.http.jsonio import json_response, off_loop, read_request
from pagedserve.server.api.http.limits import ServerLimits, check_prompt_tokens
from pagedserve.server.api.http.sse import StreamLiveness, stream_events, stream_typed_events
from pagedserve.server.api.serving.generation import BATCHES_KEY, GenerationBatch, Prompt
from pagedserve.server.api.telemetry.metrics import METRICS_KEY
from pagedserve.server.api.telemetry.tracing import TRACING_KEY
from pagedserve.server.api.tools.formats import ModelTools
from pagedserve.server.engine.core.outputs import RequestOutput

if TYPE_CHECKING:
    from pagedserve.server.engine.async_engine import AsyncEngine
    from pagedserve.server.tokenizer.base import Tokenizer

try:
    VERSION = importlib.metadata.version("pagedserve")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "0.0.0"
SYSTEM_FINGERPRINT = f"fp_pagedserve_{VERSION}"
T = TypeVar("T")
Events = AsyncIterator[list[dict[str, Any]]]


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

    def model_tools(self) -> ModelTools:
        """The model's tool format (``--tool-call-parser``, by default read from the chat
        template) and what its template shows."""
        tokenizer = self.tokenizer
        return ModelTools.of(tokenizer.chat_template, dict(tokenizer.special_tokens_map),
                             self.app[CONFIG_KEY].tool_call_parser,
                             frozenset(tokenizer.special_texts))

    def liveness(self, request: web.Request) -> StreamLiveness:
        """When the request's stream gets keep-alive comments: only where it asks for them."""
        config = self.app[CONFIG_KEY]
        interval = (config.stream_keepalive_interval if HEADER_KEEPALIVE in request.headers
                    else None)
        return StreamLiveness(interval, config.engine_stall_timeout, self.engine.stalled_for)

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
    if params.num_samples != params.n:
        raise invalid_request(
            f"best_of ({params.best_of}) different from n ({params.n}) cannot be combined "
            f"with stream", param="stream",
        )


@dataclass(slots=True)
class EncodedPrompt:
    """A prompt as the engine takes it, and its text (None where nothing needs it)."""

    text: str | None
    token_ids: list[int]


class RouteRequest(Protocol):
    """What the pipeline reads of every route's request body."""

    model: str
    stream: bool
    request_id: str | None


Req = TypeVar("Req", bound=RouteRequest)


class Route(ABC, Generic[Req]):
    """One generation route. The class holds the protocol that the pipeline asks for before
    anything is tokenized (``parse``, ``params_of``, ``check``, ``encode``); an instance is
    one request's view, which shapes its engine outputs (``stream``, ``body``). ``handle``
    runs the pipeline: it is the route's aiohttp handler.

    ``id_prefix`` names the engine requests (``PREFIX-<hex>``, and ``-<i>`` for each prompt
    when ``numbered``); ``response_prefix`` goes before the id a response carries;
    ``prompt_field`` is the field blamed for too many prompt tokens; ``typed_events``: the
    stream sends typed events (``event:`` lines, no ``[DONE]``) instead of chunks."""

    id_prefix: ClassVar[str]
    response_prefix: ClassVar[str]
    prompt_field: ClassVar[str]
    numbered: ClassVar[bool] = False
    typed_events: ClassVar[bool] = False

    def __init__(self, serving: Serving, req: Req, params: SamplingParams,
                 prompts: list[EncodedPrompt], response_id: str) -> None:
        self.serving = serving
        self.req = req
        self.params = params
        self.prompts = prompts
        self.response_id = response_id
        self.created = now_seconds()

    @classmethod
    @abstractmethod
    def parse(cls, body: Any) -> Req:
        """The request body, read and type-checked (a ``protocol`` parser)."""

    @classmethod
    def prepare(cls, serving: Serving, req: Req) -> None:
        """What the server changes in the request before its params are read (a chat's
        tools, in the model's tool format)."""

    @classmethod
    @abstractmethod
    def params_of(cls, req: Req) -> SamplingParams:
        """The sampling params the body asks for."""

    @classmethod
    def check(cls, serving: Serving, req: Req, params: SamplingParams) -> None:
        """The route's own refusals, before anything is tokenized."""

    @classmethod
    @abstractmethod
    def encode(cls, serving: Serving, req: Req) -> list[EncodedPrompt]:
        """The prompts as token ids (off the event loop for a large body)."""

    @abstractmethod
    def stream(self, batch: GenerationBatch) -> Events:
        """The stream's events, a list per step."""

    @abstractmethod
    def body(self, finals: list[RequestOutput]) -> dict[str, Any]:
        """The whole response, from each prompt's final output."""

    def envelope(self, kind: str) -> dict[str, Any]:
        return self.serving.envelope(self.response_id, self.created, kind)

    @classmethod
    async def handle(cls, request: web.Request) -> web.StreamResponse:
        req = await read_request(request, cls.parse)
        serving = Serving.of(request)
        serving.check_model(req.model)
        cls.prepare(serving, req)
        params = cls.params_of(req)
        cls.check(serving, req, params)
        prompts = await serving.tokenization(request, lambda: cls.encode(serving, req))
        check_prompt_tokens(serving.limits, sum(len(p.token_ids) for p in prompts),
                            cls.prompt_field)
        view = cls(serving, req, params, prompts,
                   response_id(request, cls.response_prefix, req.request_id))
        async with serving.batch() as batch:
            await batch.submit(params, cls._engine_requests(prompts))
            if req.stream:
                await batch.admitted()
                send = stream_typed_events if cls.typed_events else stream_events
                return await send(request, view.stream(batch), serving.liveness(request))
            finals = await batch.final_outputs()
        return json_response(view.body(finals))

    @classmethod
    def _engine_requests(cls, prompts: list[EncodedPrompt]) -> list[Prompt]:
        request_id = new_request_id(cls.id_prefix)
        if not cls.numbered:
            (prompt,) = prompts
            return [(request_id, prompt.token_ids, prompt.text)]
        return [(f"{request_id}-{i}", p.token_ids, p.text) for i, p in enumerate(prompts)]
