"""Client fan-out: what the batch runner gets out of a server, local and API-like.

    python -m benchmarks.client_fanout [--quick] [--model tiny] [--base-url URL] [--no-api]

Part 1, a local server. Starts ``pagedserve serve --model MODEL`` on a free port (unless
``--base-url`` names a running server), waits for ``GET /health``, then sends the same prompts
five ways, in one process and against the same server:

  sequential   one request at a time
  gather       every request at once (unbounded ``asyncio.gather``)
  openai_sem32 the openai SDK's ``AsyncOpenAI`` behind a semaphore of 32
  batch_fixed  ``BatchRunner`` with a fixed in-flight budget (the server's KV token capacity)
  batch_auto   ``BatchRunner`` with the adaptive budget that follows the load hints

Against a local server on a few cores the speedup over sequential calls is capped by how well
the server batches, whatever the client does; so each mode is reported as *saturation*, its
share of the best unbudgeted fan-out's throughput (``gather`` or ``openai_sem32``), with wall
time, errors, lost requests (those without exactly one answer) and the server's preemptions.

Part 2, the setting the budgeted runner is for: an API-like server (``api_like_server.py``:
fixed latency per request, a tokens-per-minute limit answered with 429 and Retry-After). The
same token-id prompts go sequentially (a prefix of them, enough to time one call) and through
the runner twice: told the TPM limit (``--tpm``, the headline) and not told it (only 429s
and Retry-After pace it). Reported: the speedup over sequential calls in tokens per second,
the share of the TPM limit used (tokens sent over the most the limit admits in the run's wall
time, its one-second burst included), 429s, failed and lost items.

The last line is JSON: ``saturation`` per local mode, ``speedup_vs_sequential`` for the two
local batch modes, and under ``api``, ``speedup_vs_sequential``, ``tpm_share``, ``failed`` and
``lost`` for the runner. Ratios are what this measures; absolute numbers mean something only
on the hardware they came from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.fanout_api import run_api
from benchmarks.harness import free_port, pagedserve_command, running, wait_ready
from pagedserve.client import (
    AsyncClient,
    BatchRequest,
    BatchRunner,
    PoolConfig,
    TiktokenCounter,
    Timeout,
    build_pool,
)

WORDS = [
    "paged", "attention", "keeps", "the", "key", "value", "cache", "in", "fixed", "blocks",
    "mapped", "through", "a", "block", "table", "so", "memory", "is", "allocated", "on",
    "demand", "shared", "across", "samples", "and", "freed", "when", "request", "ends",
]


class Tally(NamedTuple):
    errors: int
    lost: int
    prompt_tokens: int
    completion_tokens: int


@dataclass
class ModeResult:
    wall_s: float
    requests: int
    errors: int
    lost: int
    prompt_tokens: int
    completion_tokens: int
    preemptions: int | None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0


def make_prompts(count: int) -> list[str]:
    """Deterministic prompts of varied length (8 to 71 words)."""
    return [
        f"Request {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i % 64))
        for i in range(count)
    ]


async def preemptions(url: str) -> int | None:
    async with AsyncClient(url, max_retries=1) as client:
        load = await client.load()
    return None if load is None else load.num_preemptions


class Bench:
    def __init__(self, url: str, model: str, prompts: list[str], max_tokens: int, extra: dict):
        self.url, self.model, self.prompts = url, model, prompts
        self.max_tokens, self.extra = max_tokens, extra

    def body(self, prompt: str) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": 0.0, **self.extra}

    async def measure(self, run: Callable[[], Awaitable[Tally]]) -> ModeResult:
        before = await preemptions(self.url)
        start = time.perf_counter()
        tally = await run()
        wall = time.perf_counter() - start
        after = await preemptions(self.url)
        delta = None if before is None or after is None else after - before
        return ModeResult(wall, len(self.prompts), *tally, delta)

    async def _own_client(self, concurrent: bool) -> Tally:
        limit = len(self.prompts) if concurrent else 1
        async with AsyncClient(self.url, max_connections=limit, timeout=Timeout(total=3600)) as c:
            async def one(prompt: str):
                return await c.completions.create(**self.body(prompt))

            if concurrent:
                outcomes = await asyncio.gather(*map(one, self.prompts), return_exceptions=True)
            else:
                outcomes = []
                for prompt in self.prompts:
                    try:
                        outcomes.append(await one(prompt))
                    except Exception as exc:  # counted, not fatal: the benchmark reports it
                        outcomes.append(exc)
        return _tally([(o.usage if not isinstance(o, BaseException) else o) for o in outcomes])

    async def sequential(self) -> Tally:
        return await self._own_client(concurrent=False)

    async def gather(self) -> Tally:
        return await self._own_client(concurrent=True)

    async def openai_semaphore(self, width: int = 32) -> Tally:
        from openai import AsyncOpenAI  # imported (and timed) once, during the warm-up

        client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=3600)
        gate = asyncio.Semaphore(width)

        async def one(prompt: str):
            body = self.body(prompt)
            extra_body = {k: body.pop(k) for k in list(body) if k in self.extra}
            async with gate:
                return (await client.completions.create(**body, extra_body=extra_body)).usage

        try:
            outcomes = await asyncio.gather(*map(one, self.prompts), return_exceptions=True)
        finally:
            await client.close()
        return _tally(list(outcomes))

    async def batch(self, budget: int | str) -> Tally:
        config = PoolConfig(base_urls=[self.url], max_inflight_tokens=budget,
                            timeout=Timeout(total=3600))
        requests = [BatchRequest(str(i), "completions", self.body(p))
                    for i, p in enumerate(self.prompts)]
        async with await build_pool(config) as pool:
            results = await BatchRunner(pool).run(requests)
        answers = Counter(r.custom_id for r in results)
        lost = sum(answers[request.custom_id] != 1 for request in requests)
        return _tally([r.usage if r.ok else RuntimeError(r.error) for r in results], lost)


def _tally(outcomes: list[Any], lost: int = 0) -> Tally:
    """``outcomes`` holds a usage or an exception per answer; the other modes get exactly one
    per prompt from ``gather`` or their loop, so only the batch runner can lose any."""
    errors = sum(isinstance(o, BaseException) for o in outcomes)
    good = [o for o in outcomes if not isinstance(o, BaseException) and o is not None]
    return Tally(errors, lost, sum(o.prompt_tokens for o in good),
                 sum(o.completion_tokens for o in good))


async def run_modes(args: argparse.Namespace, url: str) -> dict[str, ModeResult]:
    prompts = make_prompts(args.prompts)
    extra = {} if args.no_ignore_eos else {"ignore_eos": True}  # every answer max_tokens long
    bench = Bench(url, args.model_name or args.model, prompts, args.max_tokens, extra)
    async with AsyncClient(url) as client:
        load = await client.load()
        await client.completions.create(**bench.body("warm up"))
    # One-time costs that belong to no mode: the openai SDK's import, tiktoken's vocabulary.
    import openai  # noqa: F401

    TiktokenCounter()
    budget = args.budget or (load.total_kv_tokens if load and load.total_kv_tokens else 32_768)
    modes: dict[str, Callable[[], Awaitable[Tally]]] = {
        "sequential": bench.sequential,
        "gather": bench.gather,
        "openai_sem32": bench.openai_semaphore,
        "batch_fixed": lambda: bench.batch(budget),
        "batch_auto": lambda: bench.batch("auto"),
    }
    results = {}
    for name, run in modes.items():
        results[name] = await bench.measure(run)
        r = results[name]
        print(f"{name:>13}: {r.wall_s:8.2f} s  {r.tokens_per_s:9.1f} tok/s  "
              f"errors {r.errors:4d}  lost {r.lost:4d}  preemptions {r.preemptions}",
              flush=True)
    return results


def summary_line(args: argparse.Namespace, results: dict[str, ModeResult]) -> dict[str, Any]:
    base = results["sequential"].wall_s
    best = max(results["gather"].tokens_per_s, results["openai_sem32"].tokens_per_s)
    saturation = {k: v.tokens_per_s / best for k, v in results.items()}
    print("saturation (share of the best unbudgeted fan-out): " + ", ".join(
        f"{k} {v:.2f}" for k, v in saturation.items()), flush=True)
    return {
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "modes": {k: {**asdict(v), "tokens_per_s": v.tokens_per_s} for k, v in results.items()},
        "saturation": saturation,
        "speedup_vs_sequential": {k: base / results[k].wall_s
                                  for k in ("batch_fixed", "batch_auto")},
        "errors": {k: v.errors for k, v in results.items()},
        "lost": {k: v.lost for k, v in results.items()},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="model for `pagedserve serve`")
    parser.add_argument("--model-name", default=None, help="model id in requests")
    parser.add_argument("--base-url", default=None, help="use this running server instead")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="40 prompts, 16 tokens each")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--budget", type=int, default=None,
                        help="fixed budget in tokens (default: the server's KV capacity)")
    parser.add_argument("--no-ignore-eos", action="store_true")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for `pagedserve serve` (repeatable)")
    parser.add_argument("--no-local", action="store_true", help="skip part 1")
    parser.add_argument("--no-api", action="store_true", help="skip part 2")
    parser.add_argument("--api-latency", type=float, default=0.25,
                        help="seconds each API-like request takes")
    parser.add_argument("--api-tpm", type=float, default=600_000,
                        help="the API-like server's tokens-per-minute limit")
    parser.add_argument("--api-requests", type=int, default=1500)
    parser.add_argument("--api-sequential", type=int, default=40,
                        help="how many of them to time one at a time")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.max_tokens = 40, 16
        args.api_requests, args.api_sequential = 400, 16
    return args


async def _main(args: argparse.Namespace, url: str | None, process) -> dict[str, Any]:
    line: dict[str, Any] = {}
    if url is not None:
        await asyncio.to_thread(wait_ready, url, process, args.startup_timeout)
        line = summary_line(args, await run_modes(args, url))
    if not args.no_api:
        line["api"] = await run_api(args.api_latency, args.api_tpm, args.api_requests,
                                    args.api_sequential)
    line["load_average"] = os.getloadavg()[0]
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.base_url or args.no_local:
        url = None if args.no_local else args.base_url.rstrip("/")
        print(json.dumps(asyncio.run(_main(args, url, None))))
        return 0
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"client_fanout_server_{os.getpid()}.log"
    command = pagedserve_command("--model", args.model, "--port", str(port), *args.server_arg)
    with running(command, log=log) as process:
        try:
            line = asyncio.run(_main(args, f"http://127.0.0.1:{port}", process))
        except Exception:
            print(f"server log: {log}\n{log.read_text(errors='replace')[-4000:]}",
                  file=sys.stderr)
            raise
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
