"""The soak's traffic (``soak.py``): request bodies for ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/responses``, streamed and plain, and the check that a
finished one got exactly what it asked for.

Every request runs with ``ignore_eos``, so one that completes has exactly ``n × max_tokens``
tokens, each choice ended by its length limit ("length"; a response is "incomplete" for
reason ``max_output_tokens``); anything else, or an error, counts as lost.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

MODEL = "tiny"
COMPLETIONS, CHAT, RESPONSES = "/v1/completions", "/v1/chat/completions", "/v1/responses"
_WORDS = ("paged", "attention", "block", "table", "cache", "prefix", "swap", "token",
          "batch", "decode", "beam", "sample", "request", "kernel", "memory", "sequence")


@dataclass(slots=True)
class SoakRequest:
    path: str
    body: dict[str, Any]
    n: int
    max_tokens: int
    abort: bool  # the client hangs up before the end

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def make_request(rng: random.Random) -> SoakRequest:
    """One request of the mix: 60% completions (n up to 4, best_of, beam search), 20% chat
    (n up to 3), 20% responses; about 40% streamed; sampled or greedy; 12% hang up."""
    text = " ".join(rng.choices(_WORDS, k=rng.randint(2, 30)))
    max_tokens = rng.randint(2, 12)
    kind = rng.random()
    if kind < 0.6:
        body, n = _completion(rng, text, max_tokens), None
    elif kind < 0.8:
        n = rng.randint(1, 3)
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "n": n}
        if rng.random() < 0.4:
            body.update(stream=True, stream_options={"include_usage": True})
    else:
        n = 1
        body = {"input": text, "max_output_tokens": max_tokens,
                "stream": rng.random() < 0.4}
    if "use_beam_search" not in body:
        body["temperature"] = rng.choice([0.0, 0.7, 1.0])
        if rng.random() < 0.3:
            body["seed"] = rng.randrange(1000)
    path = COMPLETIONS if kind < 0.6 else CHAT if kind < 0.8 else RESPONSES
    return SoakRequest(path, {"model": MODEL, "ignore_eos": True, **body},
                       body.get("n", n), max_tokens, rng.random() < 0.12)


def _completion(rng: random.Random, prompt: str, max_tokens: int) -> dict[str, Any]:
    n = rng.randint(1, 4)
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "n": n}
    style = rng.random()
    if style < 0.4:
        body.update(stream=True, stream_options={"include_usage": True})
    elif style < 0.5:
        body.update(use_beam_search=True, n=min(n, 3), best_of=min(n, 3))
    elif style < 0.65:
        body["best_of"] = n + 1
    return body


def check_plain(req: SoakRequest, result: dict[str, Any]) -> str | None:
    if req.path == RESPONSES:
        return _check_response(req, result)
    expected = req.n * req.max_tokens
    reasons = [c["finish_reason"] for c in result["choices"]]
    if len(reasons) != req.n or set(reasons) != {"length"}:
        return f"finish reasons {reasons} for n={req.n}"
    if result["usage"]["completion_tokens"] != expected:
        return f"{result['usage']['completion_tokens']} tokens, expected {expected}"
    return None


def check_stream(req: SoakRequest, chunks: list[dict[str, Any]]) -> str | None:
    """``chunks``: the stream's payloads, ``[DONE]`` left out."""
    errors = [c for c in chunks if "error" in c or c.get("type") == "error"]
    if errors:
        return f"error event {errors[0]}"
    if req.path == RESPONSES:
        last = chunks[-1] if chunks else {}
        if last.get("type") != "response.incomplete":
            return f"the stream ended with {last.get('type')}, not response.incomplete"
        return _check_response(req, last["response"])
    finished = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
                for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    if finished != {i: "length" for i in range(req.n)}:
        return f"finish reasons {finished} for n={req.n}"
    usage = chunks[-1].get("usage") or {}
    if usage.get("completion_tokens") != req.n * req.max_tokens:
        return f"usage {usage}, expected {req.n * req.max_tokens} tokens"
    return None


def _check_response(req: SoakRequest, response: dict[str, Any]) -> str | None:
    details = response.get("incomplete_details") or {}
    if (response["status"], details.get("reason")) != ("incomplete", "max_output_tokens"):
        return f"status {response['status']} ({details}), expected incomplete"
    if response["usage"]["output_tokens"] != req.max_tokens:
        return f"{response['usage']['output_tokens']} tokens, expected {req.max_tokens}"
    return None
