"""Soak: a `pagedserve serve` process under minutes of mixed traffic, checked for what must not
happen in production: an engine death, a lost request, a leaked KV block, a memory leak.

The traffic (``soak_mix.py``) mixes completions, chat and responses, streamed and plain, n
from 1 to 4, best_of, beam search, sampled and greedy decoding, and clients that hang up
mid-request. Every request runs with ``ignore_eos``, so one that completes has exactly
``n × max_tokens`` tokens, each choice ended by its length limit; anything else, or an
error, counts as lost. The server runs the embedded tiny
model with a small KV cache, so preemption happens too, and chunked prefill. Rounds of
requests repeat until the time is up; the server's RSS is sampled after each round, the first
(warm-up) round being the baseline.

The server computes in float32 by default (``--dtype``). In bfloat16 on a CPU, oneDNN compiles
and caches a kernel for every new matmul shape (up to 1,024 of them), so RSS climbs for the
first several hundred requests before it levels off (measured: +55 % by request 700, flat
after); that bounded cache would hide a leak in the serving stack, which is what this looks
for.

    python -m benchmarks.soak [--quick] [--duration 300] [--max-requests N] [--seed 0]
                              [--dtype float32]

It prints requests by outcome, p50/p99 latency of completed requests, the RSS samples and
their slope; the last line is JSON with ``engine_deaths``, ``lost_requests``,
``kv_blocks_leaked`` (all must be 0) and ``rss_growth_ratio`` (last sample / warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.harness import launch_pagedserve, stop
from benchmarks.soak_mix import (
    MODEL,
    RESPONSES,
    SoakRequest,
    check_plain,
    check_stream,
    make_request,
)
from pagedserve.client.api.sse import iter_sse

BLOCK_SIZE = 16
SERVER_FLAGS = ["--max-model-len", "128", "--num-kv-blocks", "48", "--block-size",
                str(BLOCK_SIZE), "--max-num-seqs", "32", "--max-num-batched-tokens", "64",
                "--disable-access-log"]
_START_TIMEOUT_S = 300.0
_IDLE_TIMEOUT_S = 30.0
_REQUEST_TIMEOUT_S = 120.0


@dataclass(slots=True)
class Outcomes:
    counts: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # what went wrong, one line per request

    def record(self, outcome: str, latency: float | None = None,
               problem: str | None = None) -> None:
        self.counts[outcome] += 1
        if latency is not None:
            self.latencies.append(latency)
        if problem is not None:
            self.lost.append(problem)


async def run_one(session: aiohttp.ClientSession, base_url: str, req: SoakRequest,
                  rng: random.Random, outcomes: Outcomes) -> None:
    start = time.monotonic()
    url = base_url + req.path
    try:
        if req.stream:
            problem = await _stream(session, url, req)
        else:
            coro = _plain(session, url, req)
            if req.abort:
                try:
                    problem = await asyncio.wait_for(coro, rng.uniform(0.02, 0.5))
                except TimeoutError:
                    outcomes.record("aborted by client")
                    return
            else:
                problem = await coro
    except (TimeoutError, aiohttp.ClientError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem == "aborted":
        outcomes.record("aborted by client")
    elif problem is None:
        outcomes.record("completed", time.monotonic() - start)
    else:
        outcomes.record("lost", problem=f"{req.path} {json.dumps(req.body)}: {problem}")


async def _plain(session: aiohttp.ClientSession, url: str, req: SoakRequest) -> str | None:
    async with session.post(url, json=req.body) as response:
        result = await response.json()
        if response.status != 200:
            return f"HTTP {response.status}: {result}"
        return check_plain(req, result)


async def _stream(session: aiohttp.ClientSession, url: str, req: SoakRequest) -> str | None:
    async with session.post(url, json=req.body) as response:
        if response.status != 200:
            return f"HTTP {response.status}: {await response.text()}"
        chunks = []
        async for event in iter_sse(response.content):
            if event.is_done:
                return check_stream(req, chunks)
            chunks.append(event.json())
            if req.abort:
                response.close()  # the client hangs up mid-stream
                return "aborted"
        if req.path == RESPONSES:  # its stream ends with the connection, no [DONE]
            return check_stream(req, chunks)
        return "stream ended without [DONE]"


async def run_round(base_url: str, rng: random.Random, size: int, concurrency: int,
                    outcomes: Outcomes) -> None:
    requests = [make_request(rng) for _ in range(size)]
    slots = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(req: SoakRequest) -> None:
            async with slots:
                await run_one(session, base_url, req, rng, outcomes)

        await asyncio.gather(*(one(r) for r in requests))


async def server_state(base_url: str) -> tuple[bool, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url + "/health") as health:
            healthy = health.status == 200
        async with session.get(base_url + "/load") as load:
            return healthy, await load.json()


async def wait_idle(base_url: str) -> dict[str, Any]:
    """The /load numbers once nothing runs or waits and the KV cache is free again (or as
    they stand when the wait times out)."""
    deadline = time.monotonic() + _IDLE_TIMEOUT_S
    while True:
        _, load = await server_state(base_url)
        if (load["num_running"] == load["num_waiting"] == 0
                and load["free_token_capacity"] == load["total_kv_tokens"]):
            return load
        if time.monotonic() > deadline:
            return load
        await asyncio.sleep(0.05)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def slope_per_min(times: list[float], values: list[float]) -> float:
    if len(times) < 2:
        return 0.0
    return statistics.linear_regression(times, values).slope * 60


async def soak(base_url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    outcomes = Outcomes()
    deaths = 0
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    rounds = 0
    while True:
        await run_round(base_url, rng, args.round_size, args.concurrency, outcomes)
        rounds += 1
        load = await wait_idle(base_url)
        healthy, _ = await server_state(base_url)
        deaths += not healthy
        samples.append((time.monotonic() - started, rss_mb(pid)))
        print(f"round {rounds}: {sum(outcomes.counts.values())} requests, "
              f"RSS {samples[-1][1]:.1f} MB, running {load['num_running']}, "
              f"waiting {load['num_waiting']}", flush=True)
        done = sum(outcomes.counts.values())
        if time.monotonic() - started >= args.duration or (
                args.max_requests is not None and done >= args.max_requests):
            break
    load = await wait_idle(base_url)
    used_tokens = load["total_kv_tokens"] - load["free_token_capacity"]
    times, values = [t for t, _ in samples[1:]], [v for _, v in samples[1:]]
    baseline = samples[0][1]
    latencies = sorted(outcomes.latencies)
    for problem in outcomes.lost[:10]:
        print("lost:", problem)
    return {
        "requests": sum(outcomes.counts.values()),
        "completed": outcomes.counts["completed"],
        "aborted_by_client": outcomes.counts["aborted by client"],
        "lost_requests": outcomes.counts["lost"],
        "engine_deaths": deaths,
        "kv_blocks_leaked": -(-used_tokens // BLOCK_SIZE),
        "num_running_after": load["num_running"],
        "num_waiting_after": load["num_waiting"],
        "p50_latency_s": round(_quantile(latencies, 0.5), 3),
        "p99_latency_s": round(_quantile(latencies, 0.99), 3),
        "rss_mb_samples": [round(v, 1) for _, v in samples],
        "rss_slope_mb_per_min": round(slope_per_min(times, values), 3),
        "rss_growth_ratio": round(samples[-1][1] / baseline, 4),
        "duration_s": round(time.monotonic() - started, 1),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def report(result: dict[str, Any]) -> None:
    print(f"\n{'outcome':<20}{'requests':>10}")
    for key in ("completed", "aborted_by_client", "lost_requests"):
        print(f"{key:<20}{result[key]:>10}")
    print(f"latency p50 {result['p50_latency_s']} s, p99 {result['p99_latency_s']} s")
    print(f"RSS samples (MB): {result['rss_mb_samples']}")
    print(f"RSS slope after warm-up: {result['rss_slope_mb_per_min']} MB/min, "
          f"growth {result['rss_growth_ratio']}x")
    print(f"engine deaths {result['engine_deaths']}, KV blocks leaked "
          f"{result['kv_blocks_leaked']}, running/waiting after "
          f"{result['num_running_after']}/{result['num_waiting_after']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0,
                        help="seconds of traffic (rounds finish what they started)")
    parser.add_argument("--quick", action="store_true", help="about one minute")
    parser.add_argument("--max-requests", type=int, default=None,
                        help="stop after the round that reaches this many requests")
    parser.add_argument("--round-size", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", help="the server's --dtype")
    args = parser.parse_args()
    if args.quick:
        args.duration = 60.0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    process, base_url = launch_pagedserve(
        ["--model", MODEL, "--dtype", args.dtype, *SERVER_FLAGS], _START_TIMEOUT_S)
    try:
        result = asyncio.run(soak(base_url, process.pid, args))
        result["engine_deaths"] += process.poll() is not None
    finally:
        status = stop(process, 60.0)
    result["server_exit_status"] = status
    report(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
