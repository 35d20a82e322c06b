"""RequestStream: outputs handed to a sink arrive in order, those queued before the sink first,
and the stream knows when its request ended (so closing it aborts only a live request)."""

from __future__ import annotations

import pytest

from pagedserve.server.engine.async_engine import RequestStream
from pagedserve.server.engine.core.outputs import RequestMetrics, RequestOutput


class _Engine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _output(step: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1], outputs=[],
                         finished=finished, metrics=RequestMetrics(arrival_time=float(step)))


async def test_queued_outputs_reach_the_sink_first_then_the_rest_in_order() -> None:
    engine = _Engine()
    stream = RequestStream("r", engine)
    stream.put(_output(0))
    stream.put(_output(1))
    received: list[float] = []
    stream.deliver_to(lambda item: received.append(item.metrics.arrival_time))
    assert received == [0.0, 1.0] and not stream.finished
    stream.put(_output(2, finished=True))
    assert received == [0.0, 1.0, 2.0] and stream.finished
    await stream.aclose()
    assert engine.aborted == []


async def test_an_error_ends_the_stream_and_settles_admission() -> None:
    engine = _Engine()
    stream = RequestStream("r", engine)
    received: list[object] = []
    stream.deliver_to(received.append)
    error = RuntimeError("rejected")
    stream.put(error)
    assert received == [error] and stream.finished
    with pytest.raises(RuntimeError, match=r"^rejected$"):
        await stream.admitted()
    await stream.aclose()
    assert engine.aborted == []


async def test_closing_a_live_stream_aborts_its_request() -> None:
    engine = _Engine()
    stream = RequestStream("r", engine)
    stream.deliver_to(lambda item: None)
    stream.put(_output(0))
    await stream.aclose()
    assert engine.aborted == ["r"]
