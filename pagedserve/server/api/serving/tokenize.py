"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extensions): the exact tokens the
server would feed the engine, so clients can count before they send."""

from __future__ import annotations

import orjson
from aiohttp import web

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.http.jsonio import json_response, read_request
from pagedserve.server.api.protocol.tokenize import (
    parse_detokenize_request,
    parse_tokenize_request,
)
from pagedserve.server.api.serving.chat import encode_chat
from pagedserve.server.api.serving.pipeline import Serving


async def tokenize(request: web.Request) -> web.Response:
    req = await read_request(request, parse_tokenize_request)
    serving = Serving.of(request)
    serving.check_model(req.model)
    tokenizer, max_model_len = serving.tokenizer, serving.engine.max_model_len
    serving.model_tools().apply(req)  # the prompt chat would encode

    def work() -> bytes:
        # The answer's JSON too: for a large input it is a large list.
        if req.messages is not None:
            _, tokens = encode_chat(serving, req.messages, req.rendering, req.add_special_tokens)
        else:
            # exactly one of prompt and messages is set (parse_tokenize_request)
            tokens = tokenizer.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
        return orjson.dumps({"count": len(tokens), "tokens": tokens,
                             "max_model_len": max_model_len})

    body = await serving.tokenization(request, work)
    return web.Response(body=body, content_type="application/json")


async def detokenize(request: web.Request) -> web.Response:
    req = await read_request(request, parse_detokenize_request)
    serving = Serving.of(request)
    serving.check_model(req.model)
    vocab = serving.engine.vocab_size
    bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(
            f"token id {bad} is out of range for a vocabulary of {vocab}", param="tokens")
    return json_response({"prompt": serving.tokenizer.decode(req.tokens)})
