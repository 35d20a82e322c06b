"""What a request the server cannot take leaves behind: one rate-limited WARNING line for a
request the HTTP parser rejects, and 413s that name what was measured."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine

from pagedserve.server.api.telemetry.server_log import SERVER_LOG_KEY, ServerLog
from tests.api.conftest import MAX_BODY_BYTES
from tests.api.live_server import LiveServer
from tests.api.test_limits import error, raw_request

COMPLETION_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   b"\r\nConnection: close\r\n")


def test_rejections_are_one_line_each_at_most_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = ServerLog(interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    for _ in range(4):
        log.exception("Error handling request from %s", "10.0.0.1",
                      exc_info=BadHttpMessage("Invalid header token:\n\n  b'x'\n  ^"))
    now[0] += 10.0
    log.exception("Error handling request from %s", "10.0.0.2", exc_info=BadStatusLine("Y"))
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (logging.WARNING, "rejected a malformed HTTP request from 10.0.0.1: BadHttpMessage "
                          "'Invalid header token'", None),
        (logging.WARNING, "rejected a malformed HTTP request from 10.0.0.2: BadStatusLine "
                          "\"Bad status line 'Y'\" (3 more since the last such line)", None),
    ]


def test_other_errors_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        ServerLog().exception("Unhandled exception", exc_info=exc)
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (logging.ERROR, "Unhandled exception")
    assert record.exc_info is not None and record.exc_info[1].args == ("boom",)


async def test_a_request_the_parser_rejects_logs_one_warning(
        server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    server_log = server.app[SERVER_LOG_KEY]
    server_log._next_line_at = None  # whatever earlier tests sent counts from here
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    for _ in range(3):
        raw = await raw_request(server.port, b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n")
        assert raw.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in records] == [
        (logging.WARNING, "rejected a malformed HTTP request from 127.0.0.1: BadHttpMessage "
                          "'Invalid header token'", None)]
    assert server_log.num_suppressed == 2


@pytest.mark.parametrize(("raw", "problem"), [
    (b"GARBAGE\r\n\r\n", "Invalid method encountered"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
     "Received HTTPS traffic on an HTTP port"),
    (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", "Bad status line: Invalid HTTP version"),
    (b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n", "Invalid header token"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     "a request line or header is longer than 8190 bytes"),
    (b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
     "a request line or header is longer than 8190 bytes"),
    (COMPLETION_HEAD + b"Content-Length: abc\r\n\r\n", "Invalid character in Content-Length"),
    (COMPLETION_HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n",
     "Duplicate Content-Length"),
    (COMPLETION_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
     "Invalid character in chunk size"),
])
async def test_a_request_the_parser_rejects_gets_a_json_400(server: LiveServer, raw: bytes,
                                                            problem: str) -> None:
    # raw_request reads to the end: the server closes the connection after the answer.
    head, _, body = (await raw_request(server.port, raw)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    assert b"\r\nContent-Type: application/json" in head
    # The problem is named; none of what was sent comes back.
    assert json.loads(body) == error(f"The request could not be parsed as HTTP: {problem}.")
    assert b"aaaa" not in body
    assert (await raw_request(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                           b"Connection: close\r\n\r\n")).startswith(
        b"HTTP/1.1 200 OK\r\n")


async def test_a_gzip_bomb_is_413_naming_both_sizes(server: LiveServer) -> None:
    bomb = gzip.compress(b" " * (16 * MAX_BODY_BYTES))
    head = COMPLETION_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    status, _, body = (await raw_request(server.port, head + bomb)).partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    assert json.loads(body.partition(b"\r\n\r\n")[2]) == error(
        f"Request body too large: {len(bomb)} bytes sent with Content-Encoding 'gzip' "
        f"decompressed to more than {MAX_BODY_BYTES} bytes, the limit (which holds for the "
        f"decompressed body).", code="request_too_large")


def chunked(data: bytes, size: int = 4096) -> bytes:
    pieces = [data[i:i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@pytest.mark.parametrize("encoding", [None, "gzip"])
async def test_a_chunked_body_over_the_limit_says_what_was_read(server: LiveServer,
                                                                encoding: str | None) -> None:
    data = b" " * (MAX_BODY_BYTES + 1)
    head = COMPLETION_HEAD + b"Transfer-Encoding: chunked\r\n"
    if encoding is not None:
        data = gzip.compress(data)
        head += f"Content-Encoding: {encoding}\r\n".encode()
    raw = await raw_request(server.port, head + b"\r\n" + chunked(data))
    status, _, body = raw.partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    message = (f"Request body too large: a chunked body sent passed {MAX_BODY_BYTES} bytes, "
               f"the limit, before its end." if encoding is None else
               f"Request body too large: a chunked body sent with Content-Encoding 'gzip' "
               f"decompressed to more than {MAX_BODY_BYTES} bytes, the limit (which holds "
               f"for the decompressed body).")
    assert json.loads(body.partition(b"\r\n\r\n")[2]) == error(message,
                                                               code="request_too_large")

