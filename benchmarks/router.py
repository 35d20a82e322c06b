"""The router in front of two replicas: prefix-cache hit rates by policy, a replica killed
mid-run, and the router's own overhead against a fast fake backend.

Hit rates. Two ``pagedserve serve tiny`` replicas with prefix caching on and deliberately
small KV caches; a workload of 8 shared system prompts (token ids, ``--system-tokens`` each) ×
``--questions`` short questions each, shuffled, streamed ``--concurrency`` at a time,
``--max-tokens`` greedy tokens each. The same workload runs through ``pagedserve router`` with
``--policy prefix`` and ``round-robin``, and against one replica with both caches' blocks (the
best any split can do). The hit rate is the engines' own: prefix-cache hit tokens over queried
tokens (``vllm:prefix_cache_*`` on /metrics), over the run. Also: each replica's share of the
requests and the client's median time to first token.

The sizing, in blocks of 16 tokens. A system prompt is 160 ids, 10 whole blocks; a question
(4-11 ids) and its 4 generated tokens fit in one more, partial block, which the prefix cache
never keeps, so every cached block belongs to a system prompt: all 8 take 80 blocks, 4 take 40.
Each replica gets ``--num-kv-blocks 42``: the 4 system prompts the prefix policy gives it
(8 prefixes split 4 and 4) plus the partial blocks of the requests in flight there. Round robin
sends all 8 to each replica, 80 blocks into 42: its cache keeps about the first half of every
prompt (a finished request frees its blocks tail first, so a chain's head is evicted last) and
hits about 42/80 of the system tokens. The single replica gets 84 blocks: all 8 and more.

The ceiling of this comparison. With the prompts mixed uniformly, round robin's hit share of
the system tokens is about C/80 for C cached blocks per replica, and the prefix policy's at most
min(1, C/40): their ratio is at most 2, reached only at C = 40 with no misses at all, while the
first question of each prompt always misses (1 of ``--questions``) and a request in flight
needs a block of its own. Measured: 1.87-1.97 at C = 40-44 (docs/benchmarks.md). A larger
cache favours round robin (C/80 grows while prefix stays at 1); a smaller one makes both thrash
alike.

Failover. The prefix run again, and after a third of the requests one replica is killed
(SIGKILL). A request that had not started streaming must be retried by the router and succeed;
one already streaming from the dead replica ends with an error event. Counted: requests lost
before their first byte (should be 0) and streams cut mid-way.

Overhead: ``benchmarks/router_overhead.py`` (added latency and streams/s against a fake
backend, loaded by ``wrk`` when it is installed).

    python -m benchmarks.router                 # everything, one JSON line at the end
    python -m benchmarks.router --skip-engine   # overhead only (no model)
    python -m benchmarks.router --skip-overhead # hit rates and failover only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from benchmarks import router_overhead
from benchmarks.harness import PAGEDSERVE, read_address, start
from benchmarks.harness import stop as harness_stop

NUM_SYSTEMS = 8
# A question's token count (the upper end excluded). A system prompt fills whole blocks; the
# question and the generated tokens then fit in one partial block, which is never cached, so
# every cached block is a system prompt's and the cache sizes below count systems exactly.
QUESTION_TOKENS = (4, 12)


# -- processes --------------------------------------------------------------------------------


async def start_process(*args: str, ready: str) -> tuple[subprocess.Popen[str], str]:
    """``python -m pagedserve ARGS`` once it prints a line starting with ``ready``; returns it
    and the URL at the end of that line."""
    process = start([*PAGEDSERVE, *args], stderr=subprocess.DEVNULL,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    return process, await asyncio.to_thread(read_address, process, 300.0, ready)


async def stop(process: subprocess.Popen[str]) -> None:
    await asyncio.to_thread(harness_stop, process)


async def start_replica(num_kv_blocks: int) -> tuple[subprocess.Popen[str], str]:
    return await start_process(
        "serve", "tiny", "--host", "127.0.0.1", "--port", "0", "--enable-prefix-caching",
        "--num-kv-blocks", str(num_kv_blocks), "--max-model-len", "256",
        "--disable-access-log", "--drain-timeout", "1",
        ready="pagedserve: serving on ")


async def start_router(replicas: list[str], policy: str, *extra: str,
                       ) -> tuple[subprocess.Popen[str], str]:
    flags = [*(f"--replica={url}" for url in replicas), *extra]
    return await start_process("router", *flags, f"--policy={policy}", "--host", "127.0.0.1",
                               "--port", "0", "--health-interval", "0.5",
                               ready="pagedserve: routing on ")


# -- workload ---------------------------------------------------------------------------------


def make_workload(num_questions: int, system_tokens: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(10, 250) for _ in range(system_tokens)] for _ in
               range(NUM_SYSTEMS)]
    prompts = [system + [rng.randrange(10, 250) for _ in range(rng.randrange(*QUESTION_TOKENS))]
               for system in systems for _ in range(num_questions)]
    rng.shuffle(prompts)
    return prompts


@dataclass
class RunResult:
    ttfts: list[float] = field(default_factory=list)
    served: Counter[str] = field(default_factory=Counter)
    lost_before_streaming: int = 0
    cut_mid_stream: int = 0


async def stream_one(http: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int,
                     result: RunResult) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    started = False
    try:
        async with http.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                result.lost_before_streaming += 1
                return
            replica = response.headers.get("X-PagedServe-Replica", url)
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if not started:
                    started = True
                    result.ttfts.append(time.perf_counter() - start)
                if b'"error"' in line:
                    result.cut_mid_stream += 1
                    return
            result.served[replica] += 1
    except aiohttp.ClientError:
        if started:
            result.cut_mid_stream += 1
        else:
            result.lost_before_streaming += 1


async def run_workload(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int,
                       on_progress: asyncio.Event | None = None) -> RunResult:
    result = RunResult()
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    done = 0

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal done
        while not queue.empty():
            await stream_one(http, url, queue.get_nowait(), max_tokens, result)
            done += 1
            if on_progress is not None and done >= len(prompts) // 3:
                on_progress.set()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return result


async def prefix_counters(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with http.get(url + "/metrics") as response:
        text = await response.text()

    def value(name: str) -> float:
        match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    return value("vllm:prefix_cache_hits_total"), value("vllm:prefix_cache_queries_total")


async def hit_rate(replicas: list[str], run: asyncio.Future[RunResult] | RunResult,
                   ) -> tuple[float, RunResult]:
    async with aiohttp.ClientSession() as http:
        before = [await prefix_counters(http, url) for url in replicas]
        result = await run if not isinstance(run, RunResult) else run
        after = [await prefix_counters(http, url) for url in replicas]
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    return (hits / queries if queries else 0.0), result


def summary(rate: float, result: RunResult) -> dict[str, object]:
    total = sum(result.served.values())
    return {"hit_rate": round(rate, 4),
            "ttft_p50_ms": round(1000 * statistics.median(result.ttfts), 2),
            "replica_shares": [round(n / total, 3) for n in sorted(result.served.values(),
                                                                   reverse=True)],
            "completed": total}


async def engine_runs(args: argparse.Namespace) -> dict[str, object]:
    prompts = make_workload(args.questions, args.system_tokens, args.seed)
    report: dict[str, object] = {}
    single, single_url = await start_replica(2 * args.num_kv_blocks)
    try:
        rate, result = await hit_rate([single_url], run_workload(
            single_url, prompts, args.max_tokens, args.concurrency))
        report["single_replica_2x_kv"] = summary(rate, result)
    finally:
        await stop(single)
    for policy in args.policies.split(","):
        # Fresh replicas per policy, so that each starts with a cold cache.
        pair = [await start_replica(args.num_kv_blocks) for _ in range(2)]
        urls = [url for _, url in pair]
        router, router_url = await start_router(urls, policy, *args.router_flag)
        try:
            rate, result = await hit_rate(urls, run_workload(
                router_url, prompts, args.max_tokens, args.concurrency))
            report[policy] = summary(rate, result)
        finally:
            await stop(router)
            for process, _ in pair:
                await stop(process)
    report["failover"] = await failover_run(args, prompts)
    single_rate = report["single_replica_2x_kv"]["hit_rate"]  # type: ignore[index]
    report["prefix_over_single"] = round(report["prefix"]["hit_rate"] / single_rate, 3)  # type: ignore[index]
    rr = report["round-robin"]["hit_rate"]  # type: ignore[index]
    report["prefix_over_round_robin"] = round(report["prefix"]["hit_rate"] / rr, 3) if rr else None  # type: ignore[index]
    return report


async def failover_run(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, object]:
    pair = [await start_replica(args.num_kv_blocks) for _ in range(2)]
    router, router_url = await start_router([url for _, url in pair], "prefix",
                                            *args.router_flag)
    progress = asyncio.Event()
    try:
        run = asyncio.ensure_future(run_workload(router_url, prompts, args.max_tokens,
                                                 args.concurrency, progress))
        await progress.wait()
        pair[1][0].kill()  # SIGKILL: no drain, connections reset
        result = await run
    finally:
        await stop(router)
        for process, _ in pair:
            await stop(process)
    return {"requests": len(prompts), "completed": sum(result.served.values()),
            "lost_before_streaming": result.lost_before_streaming,
            "cut_mid_stream": result.cut_mid_stream}


async def main(args: argparse.Namespace) -> None:
    report: dict[str, object] = {"cpus": os.cpu_count()}
    if not args.skip_overhead:
        report["overhead"] = await asyncio.to_thread(router_overhead.measure, args)
        print("overhead:", json.dumps(report["overhead"]), flush=True)
    if not args.skip_engine:
        report.update(await engine_runs(args))
    print(json.dumps(report))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=32, help="per system prompt")
    parser.add_argument("--system-tokens", type=int, default=160)
    parser.add_argument("--num-kv-blocks", type=int, default=42,
                        help="per replica (block size 16): 4 system prompts and the partial "
                        "blocks of the requests in flight")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    router_overhead.add_arguments(parser)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--router-flag", action="append", default=[],
                        help="passed to pagedserve router (repeat), "
                        "e.g. --router-flag=--load-factor=2")
    parser.add_argument("--policies", default="prefix,round-robin")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
