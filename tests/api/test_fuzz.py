"""Random request bodies: whatever a client sends, the answer is a 200 or an OpenAI-shaped
4xx, never a 500, and the engine keeps running."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.lists(st.integers(-5, 500), max_size=4), st.dictionaries(st.text(max_size=3),
                                                                 st.integers(), max_size=2),
)
SMALL_FLOAT = st.floats(-3, 3, allow_nan=False)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.one_of(SMALL_FLOAT, JUNK),
    "top_p": st.one_of(st.floats(0, 1.5, allow_nan=False), JUNK),
    "top_k": st.one_of(st.integers(-2, 500), JUNK),
    "min_p": st.one_of(SMALL_FLOAT, JUNK),
    "n": st.one_of(st.integers(-1, 4), JUNK),
    "best_of": st.one_of(st.integers(-1, 5), JUNK),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3), JUNK),
    "stop_token_ids": st.one_of(st.lists(st.integers(-1, 400), max_size=3), JUNK),
    "presence_penalty": st.one_of(SMALL_FLOAT, JUNK),
    "frequency_penalty": st.one_of(SMALL_FLOAT, JUNK),
    "repetition_penalty": st.one_of(SMALL_FLOAT, JUNK),
    "logit_bias": st.one_of(st.dictionaries(st.integers(-1, 400).map(str),
                                            st.floats(-150, 150), max_size=3), JUNK),
    "logprobs": st.one_of(st.integers(-1, 21), JUNK),
    "prompt_logprobs": st.one_of(st.integers(-1, 21), JUNK),
    "seed": st.one_of(st.integers(-1, 2**63 - 1), JUNK),
    "echo": st.one_of(st.booleans(), JUNK),
    "ignore_eos": st.one_of(st.booleans(), JUNK),
    "min_tokens": st.one_of(st.integers(-1, 4), JUNK),
    "use_beam_search": st.one_of(st.booleans(), JUNK),
    "length_penalty": st.one_of(SMALL_FLOAT, JUNK),
    "stream": st.one_of(st.booleans(), JUNK),
    "skip_special_tokens": st.one_of(st.booleans(), JUNK),
}
PROMPTS = st.one_of(
    st.text(max_size=20), st.lists(st.text(max_size=10), min_size=1, max_size=2),
    st.lists(st.integers(-1, 400), max_size=6), JUNK,
)
BODIES = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": PROMPTS,
     # Bounded, so a valid request stays fast.
     "max_tokens": st.one_of(st.integers(0, 3), JUNK.filter(lambda v: not isinstance(v, int)))},
    optional=FIELDS,
)


def post(server: LiveServer, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        server.base_url + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES)
def test_random_bodies_never_break_the_server(server: LiveServer, body: dict[str, Any]) -> None:
    status, raw = post(server, body)
    assert status in (200, 400), (status, raw)
    if status == 400:
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
    elif not body.get("stream"):
        assert json.loads(raw)["object"] == "text_completion"
    else:
        assert raw.endswith(b"data: [DONE]\n\n")
        assert b'"error"' not in raw
    assert server.engine.is_healthy
