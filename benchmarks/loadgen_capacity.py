"""How many requests per second one load-generator process sustains.

A trivial OpenAI-shaped endpoint (one text chunk, usage, [DONE]) runs in this process on its
own thread and event loop; the load generator drives it first open-loop at a target rate, then
closed-loop (max concurrency, no rate) to find its ceiling. Both share this process's GIL, so
the numbers are a floor for a generator talking to a remote server. Prints a JSON last line.

    python -m benchmarks.loadgen_capacity --num-prompts 4000 --request-rate 1000
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import threading

import orjson
from aiohttp import web

from pagedserve.loadgen.arrivals import arrivals_rng, schedule
from pagedserve.loadgen.bench import BenchSettings, make_session, run_once
from pagedserve.loadgen.bench_config import LoadShape, RequestSpec
from pagedserve.loadgen.cli import run_event_loop
from pagedserve.loadgen.datasets import DatasetSpec, load_dataset
from pagedserve.loadgen.tokenizers import TiktokenCounter

_BODY = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in (
    {"choices": [{"index": 0, "text": " hello"}]},
    {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}},
)) + b"data: [DONE]\n\n"


async def _completions(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_BODY, content_type="text/event-stream")


class _EndpointThread:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> _EndpointThread:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", _completions)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        self._loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())


def _settings(port: int, shape: LoadShape) -> BenchSettings:
    return BenchSettings(
        request=RequestSpec(base_url=f"http://127.0.0.1:{port}", model="trivial",
                            request_timeout=60.0),
        shape=shape,
        dataset=DatasetSpec(name="random", random_input_len=8, random_output_len=1),
        show_progress=False,
    )


async def _measure(port: int, shapes: list[LoadShape]) -> list[dict]:
    counter = TiktokenCounter()
    results = []
    async with make_session(None) as session:
        for shape in shapes:
            settings = _settings(port, shape)
            samples = await load_dataset(settings.dataset, min(shape.num_prompts, 256), counter)
            results.append((await run_once(session, counter, samples, settings)).result)
    return results


def _point(result: dict) -> dict:
    keys = ("request_rate", "max_concurrency", "completed", "failed", "duration",
            "request_throughput", "mean_client_lag_ms", "p99_client_lag_ms",
            "max_client_lag_ms", "mean_loop_lag_ms", "max_loop_lag_ms")
    return {key: result.get(key) for key in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=4000)
    parser.add_argument("--request-rate", type=float, default=1000.0)
    parser.add_argument("--max-concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    shapes = [
        LoadShape(num_prompts=args.num_prompts, request_rate=args.request_rate,
                  num_warmups=64),
        LoadShape(num_prompts=args.num_prompts, request_rate=math.inf,
                  max_concurrency=args.max_concurrency, num_warmups=64),
    ]
    with _EndpointThread() as endpoint:
        open_loop, closed_loop = run_event_loop(_measure(endpoint.port, shapes))
    # The rate the seeded Poisson schedule actually offers, to judge the achieved rate by.
    offsets = schedule(shapes[0], arrivals_rng(0))
    summary = {
        "target_request_rate": args.request_rate,
        "offered_request_rate": (len(offsets) - 1) / float(offsets[-1]),
        "achieved_request_rate": open_loop["request_throughput"],
        "closed_loop_request_rate": closed_loop["request_throughput"],
        "open_loop": _point(open_loop),
        "closed_loop": _point(closed_loop),
    }
    for name, point in (("open loop", open_loop), ("closed loop", closed_loop)):
        print(f"{name}: {point['completed']} ok, {point['failed']} failed, "
              f"{point['request_throughput']:.0f} req/s, "
              f"p99 client lag {point['p99_client_lag_ms']:.2f} ms", file=sys.stderr)
    print(orjson.dumps(summary).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
