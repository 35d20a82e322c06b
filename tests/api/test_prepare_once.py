"""The server checks each request once: a handler tokenizes (on the event loop, or in the
tokenizer pool for a large body) and hands the prompt to the engine's door, which checks it
(inline, or in a worker thread for a long prompt) and adds it without checking it again — for
a whole response and a stream alike. The id checks and the bad-words tokenization are counted
on the live server."""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp
import pytest

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.api.http import jsonio
from pagedserve.server.engine import async_engine
from pagedserve.server.engine.core import request_preparation
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

MESSAGES = [{"role": "user", "content": "Name a cache."}]
ROUTES = [
    ("/v1/completions", {"prompt": ["a paged cache", "a block"], "max_tokens": 2}, 2),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}, 1),
    ("/v1/responses", {"input": "Name a cache.", "max_output_tokens": 2}, 1),
]


@pytest.fixture
def counts(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of ``validate_token_ids`` and of the bad-words tokenization, from any thread."""
    counts: Counter[str] = Counter()
    validate = request_preparation.validate_token_ids
    preparer = server.engine.engine.requests
    tokenize_bad_words = preparer.bad_words_token_ids

    def counted_validate(*args: Any) -> None:
        counts["validate_token_ids"] += 1
        validate(*args)

    def counted_bad_words(params: SamplingParams) -> list[list[int]]:
        counts["bad_words_token_ids"] += 1
        return tokenize_bad_words(params)

    monkeypatch.setattr(request_preparation, "validate_token_ids", counted_validate)
    monkeypatch.setattr(preparer, "bad_words_token_ids", counted_bad_words)
    return counts


@pytest.mark.parametrize("off_loop", [False, True], ids=["inline", "off-loop"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("route", "body", "num_requests"), ROUTES,
                         ids=[route for route, _, _ in ROUTES])
async def test_each_engine_request_is_checked_once(
        server: LiveServer, counts: Counter[str], monkeypatch: pytest.MonkeyPatch,
        route: str, body: dict[str, Any], num_requests: int, stream: bool,
        off_loop: bool) -> None:
    if off_loop:  # every body counts as large: tokenizing and checking leave the loop
        monkeypatch.setattr(jsonio, "OFF_LOOP_BODY_BYTES", 0)
        monkeypatch.setattr(async_engine, "PREPARE_OFF_LOOP_TOKENS", 0)
    payload = {"model": MODEL, **body, "bad_words": ["cache"], "stream": stream}
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + route, json=payload) as response:
        text = await response.text()
    assert response.status == 200, text
    assert counts == {"validate_token_ids": num_requests,
                      "bad_words_token_ids": num_requests}
