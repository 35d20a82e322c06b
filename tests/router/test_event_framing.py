"""How the router frames a replica's stream: whole events only, whatever the chunks, and
whether the stream said it was complete."""

from __future__ import annotations

import pytest

from pagedserve.router.event_framing import EventFraming, NotEventStream

CHUNK = b'data: {"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def feed(*chunks: bytes) -> tuple[list[bytes], EventFraming]:
    framing = EventFraming()
    return [framing.whole(chunk) for chunk in chunks], framing


def test_chunks_that_end_with_an_event_pass_as_they_are() -> None:
    out, framing = feed(CHUNK, CHUNK + DONE)
    assert out[0] is CHUNK  # no copy on the usual path
    assert out == [CHUNK, CHUNK + DONE]
    assert framing.complete()


def test_an_event_split_across_chunks_waits_for_its_end() -> None:
    stream = CHUNK + FINISH + DONE
    cuts = [5, len(CHUNK) - 1, len(CHUNK) + 3, len(CHUNK + FINISH) + 13]
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    out, framing = feed(*pieces)
    assert out == [b"", b"", CHUNK, FINISH, DONE]  # the blank line split "\n" | "\n" too
    assert framing.complete()


@pytest.mark.parametrize(("chunks", "complete"), [
    ([CHUNK], False),  # close-framed and cut short
    ([], False),
    ([CHUNK, FINISH], True),  # a finish reason, though no [DONE]
    ([CHUNK, CHUNK[:20]], False),  # cut inside an event
    ([CHUNK + DONE, b": keep-alive\n\n"], True),  # comments do not count
    ([CHUNK, b": keep-alive\n\n"], False),
    ([b'data: {"error":{"message":"x","type":"server_error","param":null,"code":null}}\n\n'],
     True),
    ([b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'], True),
    ([CHUNK.replace(b"\n\n", b"\r\n\r\n") + b"data: [DONE]\r\n\r\n"], True),
    ([b"event: response.output_text.delta\ndata: {}\n\n"], False),
    ([b"event: response.completed\ndata: {}\n\n"], True),
    ([b"event: error\ndata: {}\n\n"], True),
])
def test_complete(chunks: list[bytes], complete: bool) -> None:
    _, framing = feed(*chunks)
    assert framing.complete() is complete


def test_bytes_that_never_end_an_event_are_not_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pagedserve.router.event_framing.MAX_EVENT_BYTES", 64)
    framing = EventFraming()
    assert framing.whole(b"x" * 60) == b""
    with pytest.raises(NotEventStream, match=r"^70 bytes without the blank line"):
        framing.whole(b"x" * 10)
