"""Requests that once made the server answer 500 (found by fuzzing) get a 400 in OpenAI's
shape, and an invalid stream is refused before its 200."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

COMPLETION = b'{"model": "tiny-test", "prompt": "x", "max_tokens": 1}'


def error(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


@pytest.mark.parametrize("role", [["user"], {"role": "user"}])
async def test_a_chat_role_that_is_not_a_string(server: LiveServer, role: object) -> None:
    body = {"model": MODEL, "messages": [{"role": role, "content": "x"}]}
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + "/v1/chat/completions", json=body) as response:
        assert response.status == 400
        assert await response.json() == error(
            "messages[0].role must be one of assistant, developer, system, tool, user, "
            f"got {role!r}", "messages")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_body_that_is_not_in_its_content_encoding(server: LiveServer,
                                                          encoding: str) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with aiohttp.ClientSession() as session:
        async with session.post(server.base_url + "/v1/completions", data=COMPLETION,
                                headers=headers) as response:
            assert response.status == 400
            assert await response.json() == error(
                f"The request body could not be decoded as Content-Encoding '{encoding}'.")
        # The connection it broke is closed; the server goes on serving.
        async with session.post(server.base_url + "/v1/completions", data=COMPLETION,
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == 200
    assert server.engine.is_healthy


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_an_invalid_stream_is_refused_before_it_starts(server: LiveServer,
                                                             path: str) -> None:
    # n = 40 passes the parser but exceeds max_num_seqs, which the scheduler checks.
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1, "n": 40}
    body.update({"prompt": "x"} if "chat" not in path else
                {"messages": [{"role": "user", "content": "x"}]})
    expected = error("the request runs 40 sequences at once (n / best_of), more than "
                     "max_num_seqs (16)", "n")
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            async with session.post(server.base_url + path,
                                    json={**body, "stream": stream}) as response:
                assert (response.status, await response.json()) == (400, expected)


async def test_too_wide_a_request_names_the_field_that_widened_it(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "n": 2, "best_of": 40}
    expected = error("the request runs 40 sequences at once (n / best_of), more than "
                     "max_num_seqs (16)", "best_of")
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/completions", json=body
    ) as response:
        assert (response.status, await response.json()) == (400, expected)


@pytest.mark.parametrize(("seed", "shown"), [
    ("18446744073709551616", "1.8446744073709552e+19"),  # 2**64: parsed as a float
    ("9223372036854775808", "9223372036854775808"),  # 2**63: still an integer
])
async def test_a_seed_beyond_64_bits_is_out_of_range_not_of_the_wrong_type(
        server: LiveServer, seed: str, shown: str) -> None:
    body = b'{"model": "tiny-test", "prompt": "x", "max_tokens": 1, "seed": %s}' % seed.encode()
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + "/v1/completions", data=body,
            headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        assert await response.json() == error(
            f"seed must be at most 9223372036854775807, got {shown}", "seed")
