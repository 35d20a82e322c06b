from __future__ import annotations

import pytest

from pagedserve.client.api.client_errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTimeoutError,
    UnprocessableEntityError,
    decode_error_body,
    make_status_error,
    transport_error,
)
from pagedserve.client.api.retry import RetryPolicy, is_retryable, retry_after_seconds


def _openai_body(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": "n",
                      "code": "bad_n"}}


@pytest.mark.parametrize(
    ("status", "cls", "phrase"),
    [
        (400, BadRequestError, "Bad Request"),
        (401, AuthenticationError, "Unauthorized"),
        (403, PermissionDeniedError, "Forbidden"),
        (404, NotFoundError, "Not Found"),
        (408, RequestTimeoutError, "Request Timeout"),
        (409, ConflictError, "Conflict"),
        (422, UnprocessableEntityError, "Unprocessable Entity"),
        (429, RateLimitError, "Too Many Requests"),
        (500, InternalServerError, "Internal Server Error"),
        (503, InternalServerError, "Service Unavailable"),
    ],
)
def test_status_maps_to_its_class_with_the_server_message(status, cls, phrase):
    error = make_status_error(status, _openai_body("n must be at least 1, got 0"), {}, "u")
    assert type(error) is cls
    assert error.status_code == status
    assert str(error) == f"{status} {phrase}: n must be at least 1, got 0"
    assert error.server_message == "n must be at least 1, got 0"
    assert (error.type, error.param, error.code) == ("invalid_request_error", "n", "bad_n")


def test_unlisted_status_is_a_plain_status_error():
    error = make_status_error(418, {"error": {"message": "short and stout"}}, {})
    assert type(error) is APIStatusError
    assert str(error) == "418 I'm a Teapot: short and stout"


def test_non_json_error_body_is_kept_as_text():
    body = decode_error_body(b"<html>bad gateway</html>\n")
    error = make_status_error(502, body, {"X-A": "1"})
    assert str(error) == "502 Bad Gateway: <html>bad gateway</html>"
    assert error.body == "<html>bad gateway</html>\n"
    assert error.headers == {"X-A": "1"}


def test_empty_error_body_gives_the_phrase_alone():
    assert str(make_status_error(500, decode_error_body(b""), {})) == "500 Internal Server Error"


def test_transport_errors():
    timeout = transport_error(TimeoutError(), "http://h/v1/completions")
    assert type(timeout) is APITimeoutError
    assert str(timeout) == "request to http://h/v1/completions timed out"
    refused = transport_error(ConnectionRefusedError("refused"), "http://h/x")
    assert type(refused) is APIConnectionError
    assert str(refused) == "connection to http://h/x failed: ConnectionRefusedError: refused"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"Retry-After": "3"}, 3.0),
        ({"Retry-After": "1.5", "retry-after-ms": "100"}, 0.1),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_parsing(headers, expected):
    now = 1445412480.0  # 2015-10-21 07:28:00 GMT
    assert retry_after_seconds(headers, now=lambda: now) == expected


def test_retryable_errors():
    for status in (408, 409, 429, 500, 502, 503):
        assert is_retryable(make_status_error(status, {}, {}))
    for status in (400, 401, 403, 404, 422):
        assert not is_retryable(make_status_error(status, {}, {}))
    assert is_retryable(APIConnectionError("x"))
    assert is_retryable(APITimeoutError("x"))
    assert not is_retryable(ValueError("x"))


def test_backoff_grows_caps_and_jitters():
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=3.0, jitter=0.25)
    assert [policy.backoff(i, rand=lambda: 0.0) for i in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert policy.backoff(1, rand=lambda: 1.0) == 0.75


def test_delay_prefers_retry_after_within_the_cap():
    policy = RetryPolicy(initial_backoff=0.5, jitter=0.0, max_retry_after=5.0)
    assert policy.delay(0, make_status_error(429, {}, {"retry-after-ms": "1200"})) == 1.2
    assert policy.delay(0, make_status_error(429, {}, {"Retry-After": "600"})) == 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_retries": -1}, "max_retries must be at least 0, got -1"),
        ({"initial_backoff": 2.0, "max_backoff": 1.0},
         "backoff must satisfy 0 <= initial_backoff <= max_backoff, got initial_backoff=2.0, "
         "max_backoff=1.0"),
        ({"jitter": 1.5}, "jitter must be in [0, 1], got 1.5"),
    ],
)
def test_retry_policy_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        RetryPolicy(**kwargs)
    assert str(info.value) == message
