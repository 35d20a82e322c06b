"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extensions): the exact tokens the
server would feed the engine, so clients can count before they send."""

from __future__ import annotations

from aiohttp import web

from pagedserve.server.api.jsonio import json_response, read_json
from pagedserve.server.api.protocol_tokenize import (
    parse_detokenize_request,
    parse_tokenize_request,
)
from pagedserve.server.api.serving_chat import encode_chat
from pagedserve.server.api.serving_common import Serving
from pagedserve.server.errors import InvalidRequestError


async def tokenize(request: web.Request) -> web.Response:
    req = parse_tokenize_request(await read_json(request))
    serving = Serving.of(request)
    serving.check_model(req.model)
    if req.messages is not None:
        _, tokens = encode_chat(serving, req.messages, req.add_generation_prompt)
    else:
        tokens = serving.tokenizer.encode(req.prompt)
    body = {"count": len(tokens), "tokens": tokens,
            "max_model_len": serving.engine.max_model_len}
    return json_response(body)


async def detokenize(request: web.Request) -> web.Response:
    req = parse_detokenize_request(await read_json(request))
    serving = Serving.of(request)
    serving.check_model(req.model)
    try:
        prompt = serving.tokenizer.decode(req.tokens)
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message, param="tokens") from exc
    return json_response({"prompt": prompt})
