"""The router overhead benchmark: its fake backend speaks HTTP/1.1 with keep-alive, wrk's
report is read right, and a short run through the router fails no request with either
load generator."""

from __future__ import annotations

import shutil

import aiohttp
import pytest

from tests.benchmarks.bench_scripts import last_json_line, run_script

WRK_REPORT = """Running 5s test @ http://127.0.0.1:18002/v1/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    35.68ms   19.83ms 175.60ms   84.78%
    Req/Sec     1.88k   740.78     3.50k    62.00%
  Latency Distribution
     50%  533.00us
     75%    1.13ms
     90%    3.28ms
     99%    1.05s
  9367 requests in 5.02s, 5.87MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   1864.14
Transfer/sec:      1.17MB
"""


def test_wrk_report_is_read(import_benchmark) -> None:
    overhead = import_benchmark("router_overhead")
    assert overhead.parse_wrk(WRK_REPORT) == {"rps": 1864.14, "p50_ms": 0.533,
                                              "p99_ms": 1050.0, "failed": 7}
    with pytest.raises(ValueError, match="not a wrk report"):
        overhead.parse_wrk("wrk: connection refused")


async def test_fake_backend_answers_json_and_streams_on_one_connection(import_benchmark,
                                                                       ) -> None:
    fake = import_benchmark("fake_backend")
    overhead = import_benchmark("router_overhead")
    process, url = overhead.start_backend()
    try:
        connector = aiohttp.TCPConnector(limit=1)  # one connection, reused
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(2):
                async with http.post(url + "/v1/completions",
                                     json={"prompt": "hi", "stream": True}) as response:
                    assert response.headers["Content-Type"] == "text/event-stream"
                    assert "X-PagedServe-KV-Usage" in response.headers
                    events = [line for line in (await response.read()).split(b"\n\n")
                              if line]
                    assert len(events) == fake.SSE_CHUNKS + 1
                    assert events[-1] == b"data: [DONE]"
                async with http.post(url + "/v1/completions", json={"prompt": "hi"}) as response:
                    assert (await response.json())["object"] == "text_completion"
                async with http.get(url + "/health") as response:
                    assert await response.json() == {"status": "ok"}
    finally:
        overhead.stop(process)


@pytest.mark.parametrize("client", ["aiohttp", "wrk"])
def test_a_short_run_fails_no_request(client: str) -> None:
    if client == "wrk" and shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (Debian's wrk package)")
    flags = ["--no-wrk"] if client == "aiohttp" else []
    report = last_json_line(run_script("router_overhead", "--seconds", "1", "--rounds", "1",
                                       "--connections", "4", *flags))
    assert report["load_generator"].startswith(client)
    assert report["failed"] == 0
    assert report["routed_streams_per_s"] > 0 and report["direct_streams_per_s"] > 0
