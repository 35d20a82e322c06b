"""What the HTTP layer costs: one workload through `pagedserve serve` and through the
offline ``LLM``, side by side in one run, same engine arguments, same thread count.

The server runs as its own process (as in production) and a streaming client keeps every
request in flight at once, so the engine's batch stays as full as the offline run's. Both
sides generate exactly the same number of tokens (``ignore_eos``, fixed ``max_tokens``).
Rounds alternate offline and HTTP and each side keeps its best time, so a burst of load
from other processes on a shared machine does not decide the ratio.

    python -m benchmarks.server_overhead [--quick] [--model tiny] [engine options]

The last line is JSON: ``http_tok_s``, ``offline_tok_s`` and ``ratio`` (http / offline; the
target is >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass

import aiohttp

from benchmarks.harness import launch_pagedserve, stop
from pagedserve.client.api.sse import iter_sse
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.tokenizer.base import Tokenizer

_WORDS = (
    "paged", "attention", "block", "table", "copy", "write", "cache", "prefix", "swap",
    "token", "batch", "decode", "prefill", "scheduler", "memory", "sequence", "beam",
    "sample", "request", "latency", "throughput", "kernel", "tensor",
)
_SERVER_START_TIMEOUT_S = 300.0


@dataclass(slots=True, frozen=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


def make_workload(tokenizer: Tokenizer, num_requests: int, input_len: tuple[int, int],
                  output_len: tuple[int, int], seed: int) -> list[Request]:
    """Prompts of random words (so every id decodes), lengths drawn uniformly."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        words = " ".join(rng.choice(_WORDS) for _ in range(input_len[1]))
        ids = tokenizer.encode(words)[: rng.randint(*input_len)]
        requests.append(Request(ids, rng.randint(*output_len)))
    return requests


def run_offline(llm: LLM, workload: list[Request]) -> tuple[int, float]:
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in workload]
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
              for r in workload]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs), elapsed


async def _stream_one(session: aiohttp.ClientSession, url: str, model: str,
                      request: Request) -> int:
    body = {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        # Only the usage event is decoded: the client's own CPU time stays out of what
        # this benchmark measures as far as it can.
        last = None
        async for event in iter_sse(response.content):
            if event.is_done:
                break
            if event.data.startswith('{"error"'):
                raise RuntimeError(f"server error mid-stream: {event.data}")
            last = event
        return last.json()["usage"]["completion_tokens"]


async def run_http(base_url: str, model: str, workload: list[Request]) -> tuple[int, float]:
    connector = aiohttp.TCPConnector(limit=len(workload))
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = base_url + "/v1/completions"
        start = time.perf_counter()
        counts = await asyncio.gather(*(_stream_one(session, url, model, r) for r in workload))
        elapsed = time.perf_counter() - start
    return sum(counts), elapsed


def engine_cli_args(args: EngineArgs) -> list[str]:
    """The ``serve`` flags that reproduce ``args`` (only the ones that differ from the
    defaults, so the two runs provably share one configuration)."""
    defaults = EngineArgs()
    flags = []
    for name in (f.name for f in dataclasses.fields(args)):
        value = getattr(args, name)
        if value == getattr(defaults, name):
            continue
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 short requests, one round")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating offline/HTTP rounds; each side keeps its best "
                             "(default 2, 1 with --quick)")
    parser.add_argument("--workload-seed", type=int, default=0)
    EngineArgs.add_cli_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine_args = EngineArgs.from_cli_args(args)
    num_requests = args.num_requests or (40 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 2)
    output_len = (8, 24) if args.quick else (32, 128)
    input_len = (16, 64) if args.quick else (32, 256)

    llm = LLM.from_engine_args(engine_args)
    workload = make_workload(llm.get_tokenizer(), num_requests, input_len, output_len,
                             args.workload_seed)
    server, base_url = launch_pagedserve(
        ["--served-model-name", "bench", "--disable-access-log", *engine_cli_args(engine_args)],
        _SERVER_START_TIMEOUT_S)
    offline_times, http_times = [], []
    try:
        # Warm-ups keep first-call costs out; alternating rounds spread any load from other
        # processes on the machine over both sides.
        run_offline(llm, workload[:4])
        asyncio.run(run_http(base_url, "bench", workload[:4]))
        for _ in range(rounds):
            offline_tokens, seconds = run_offline(llm, workload)
            offline_times.append(seconds)
            http_tokens, seconds = asyncio.run(run_http(base_url, "bench", workload))
            http_times.append(seconds)
    finally:
        stop(server, 60.0)

    if http_tokens != offline_tokens:
        raise RuntimeError(f"token counts differ: http {http_tokens}, offline {offline_tokens}")
    offline_s, http_s = min(offline_times), min(http_times)
    http_tok_s, offline_tok_s = http_tokens / http_s, offline_tokens / offline_s
    print(f"requests: {num_requests}, generated tokens: {http_tokens}, rounds: {rounds}, "
          f"threads: {os.environ.get('OMP_NUM_THREADS', 'default')}")
    print(f"offline LLM:  {offline_s:8.2f} s  {offline_tok_s:10.1f} tok/s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in offline_times)} s)")
    print(f"HTTP server:  {http_s:8.2f} s  {http_tok_s:10.1f} tok/s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in http_times)} s)")
    print(json.dumps({"http_tok_s": round(http_tok_s, 2), "offline_tok_s": round(offline_tok_s, 2),
                      "ratio": round(http_tok_s / offline_tok_s, 4),
                      "num_requests": num_requests, "generated_tokens": http_tokens,
                      "rounds": rounds, "model": engine_args.model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
