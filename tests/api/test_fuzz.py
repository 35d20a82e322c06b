"""Random request bodies for completions, chat (with vLLM's extra fields) and responses:
whatever a client sends, the answer is a 200 or an OpenAI-shaped 4xx, never a 500, and the
engine keeps running."""

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


# vLLM's extra fields and the chat template's inputs, for chat and responses.
EXTRA_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "add_special_tokens": st.one_of(st.booleans(), JUNK),
    "truncate_prompt_tokens": st.one_of(st.integers(-2, 2000), JUNK),
    "priority": st.one_of(st.integers(-1, 1), JUNK),
    "bad_words": st.one_of(st.lists(st.text(max_size=4), max_size=2), JUNK),
    "return_tokens_as_token_ids": st.one_of(st.booleans(), JUNK),
    "chat_template_kwargs": st.one_of(st.dictionaries(st.sampled_from(
        ["enable_thinking", "messages", "x"]), JUNK, max_size=2), JUNK),
    "documents": st.one_of(st.lists(st.dictionaries(st.text(max_size=3), st.text(max_size=3),
                                                    max_size=2), max_size=2), JUNK),
    "add_generation_prompt": st.one_of(st.booleans(), JUNK),
    "continue_final_message": st.one_of(st.booleans(), JUNK),
}
ROLES = st.sampled_from(["user", "assistant", "system", "developer", "tool", "robot"])
TEXT_PARTS = st.lists(st.fixed_dictionaries({"type": st.sampled_from(
    ["text", "input_text", "output_text", "input_image"]), "text": st.text(max_size=6)}),
    max_size=2)
MESSAGES = st.one_of(
    st.lists(st.fixed_dictionaries({"role": ROLES, "content": st.one_of(
        st.text(max_size=12), TEXT_PARTS, JUNK)}), min_size=1, max_size=3), JUNK)
SMALL_MAX = st.one_of(st.integers(0, 3), JUNK.filter(lambda v: not isinstance(v, int)))
CHAT_BODIES = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": MESSAGES, "max_tokens": SMALL_MAX},
    optional={**FIELDS, **EXTRA_FIELDS, "logprobs": st.one_of(st.booleans(), JUNK),
              "top_logprobs": st.one_of(st.integers(-1, 21), JUNK)},
)
RESPONSES_BODIES = st.fixed_dictionaries(
    {"model": st.just(MODEL), "input": st.one_of(st.text(max_size=12), MESSAGES),
     "max_output_tokens": SMALL_MAX},
    optional={"instructions": st.one_of(st.text(max_size=8), JUNK),
              "temperature": FIELDS["temperature"], "top_p": FIELDS["top_p"],
              "stream": FIELDS["stream"], "n": FIELDS["n"], "store": JUNK,
              "metadata": JUNK, "tools": st.one_of(st.just([]), JUNK),
              "truncation": st.one_of(st.sampled_from(["disabled", "auto"]), JUNK),
              "text": st.one_of(st.fixed_dictionaries({"format": st.fixed_dictionaries(
                  {"type": st.sampled_from(["text", "json_object"])})}), JUNK)},
)


def post(server: LiveServer, body: dict[str, Any],
         path: str = "/v1/completions") -> tuple[int, bytes]:
    request = urllib.request.Request(
        server.base_url + path, data=json.dumps(body).encode(),
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


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=CHAT_BODIES)
def test_random_chat_bodies_never_break_the_server(server: LiveServer,
                                                   body: dict[str, Any]) -> None:
    status, raw = post(server, body, "/v1/chat/completions")
    assert status in (200, 400), (status, raw)
    if status == 400:
        assert json.loads(raw)["error"]["type"] == "invalid_request_error"
    elif not body.get("stream"):
        assert json.loads(raw)["object"] == "chat.completion"
    else:
        assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    assert server.engine.is_healthy


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=RESPONSES_BODIES)
def test_random_responses_bodies_never_break_the_server(server: LiveServer,
                                                        body: dict[str, Any]) -> None:
    status, raw = post(server, body, "/v1/responses")
    assert status in (200, 400), (status, raw)
    if status == 400:
        assert json.loads(raw)["error"]["type"] == "invalid_request_error"
    elif not body.get("stream"):
        assert json.loads(raw)["status"] in ("completed", "incomplete")
    else:
        last = raw.rstrip().rsplit(b"\n", 1)[-1]
        assert json.loads(last.removeprefix(b"data: "))["type"] in (
            "response.completed", "response.incomplete"), raw[-500:]
        assert b"event: error" not in raw
    assert server.engine.is_healthy
