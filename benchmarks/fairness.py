"""Fairness between tenants: a small tenant's time to first token while another tenant sends
huge requests and holds hundreds of idle connections, and health probes meanwhile.

One ``pagedserve serve`` process (the embedded tiny model) with two API keys. The small
tenant (from 127.0.0.3) sends short streamed completions one after another and times each
one's first token. Three phases, in one run:

- ``solo``: the small tenant alone;
- ``fair``: the huge tenant (its own key, from 127.0.0.2) meanwhile keeps requests of many
  long prompts (``max_tokens`` 1) in flight and keeps up to ``--idle-connections`` idle
  connections open (reopened as the server closes them);
- ``one_tenant``: the same, but both send the small tenant's key: one tenant, first come
  first served, as the scheduler was without tenants (the baseline).

``/health`` is probed on the main port every ``--probe-interval`` seconds through the loaded
phases. It prints each phase's p50/p99 TTFT and the ratios to solo; the last line is JSON.

``--via router`` sends everything (requests, idle connections, probes) through ``pagedserve
router`` in front of the server, which trusts the router's address (``--forwarded-allow-ips
127.0.0.1``); ``--via direct router`` runs both against the one server, one after the other,
and adds the router's p99 TTFT over the direct one for each phase. ``--tenants addresses``
runs the server without keys, so that the tenants are the clients' addresses (behind the
router: the addresses it names in X-Forwarded-For); ``one_tenant`` then sends the huge
requests from the small tenant's address.

    python -m benchmarks.fairness [--quick] [--small-requests 40] [--idle-connections 300]
        [--phases fair one_tenant] [--server-flags '--max-shared-prefill-tokens 64']
        [--via direct router] [--tenants keys|addresses]

``--quick`` sets only what is not given: ``--quick --small-requests 40`` sends 40.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp

from benchmarks import harness
from pagedserve.client.api.sse import iter_sse

KEYS = {"huge": "huge-tenant-key", "small": "small-tenant-key"}
HUGE_ADDRESS, SMALL_ADDRESS = "127.0.0.2", "127.0.0.3"
SERVER_FLAGS = ["--max-model-len", "512", "--num-kv-blocks", "512", "--max-num-seqs", "32",
                "--max-num-batched-tokens", "512", "--dtype", "float32", "--disable-access-log",
                "--max-connections", "600", "--max-connections-per-client", "256",
                "--timeout-header-read", "5"]
# The router's front set as the server's, so that the idle connections meet the same limits.
ROUTER_FLAGS = ["--policy", "least-load", "--max-connections", "600",
                "--max-connections-per-client", "256", "--timeout-header-read", "5"]
ROUTING_ON = "pagedserve: routing on "
_START_TIMEOUT_S = 300.0
_WORDS = ("paged", "attention", "block", "table", "cache", "prefix", "swap", "token", "batch",
          "decode")


def prompt(num_words: int, offset: int) -> str:
    return " ".join(_WORDS[(offset + i) % len(_WORDS)] for i in range(num_words))


def session(address: str) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def time_to_first_token(client: aiohttp.ClientSession, url: str, key: str | None,
                              index: int) -> float:
    body = {"model": "tiny", "prompt": prompt(24, index), "max_tokens": 4, "stream": True,
            "ignore_eos": True}
    start = time.perf_counter()
    async with client.post(url + "/v1/completions", json=body,
                           headers=auth(key)) as response:
        if response.status != 200:
            raise RuntimeError(f"small request: HTTP {response.status}: {await response.text()}")
        async for event in iter_sse(response.content):
            if not event.is_done and event.json()["choices"]:
                ttft = time.perf_counter() - start
                async for _ in iter_sse(response.content):  # read the rest
                    pass
                return ttft
    raise RuntimeError("a stream without tokens")


async def small_tenant(url: str, key: str | None, count: int) -> list[float]:
    async with session(SMALL_ADDRESS) as client:
        return [await time_to_first_token(client, url, key, i) for i in range(count)]


async def huge_tenant(url: str, key: str | None, address: str, prompts: int, words: int,
                      in_flight: int, done: list[int]) -> None:
    """Keeps ``in_flight`` huge requests going until cancelled; counts those that finished
    in ``done[0]`` (a count the caller reads after cancelling it)."""
    body = {"model": "tiny", "prompt": [prompt(words, i) for i in range(prompts)],
            "max_tokens": 1}

    async def loop(client: aiohttp.ClientSession) -> None:
        while True:
            async with client.post(url + "/v1/completions", json=body,
                                   headers=auth(key)) as response:
                await response.read()
                if response.status == 200:
                    done[0] += 1
                else:
                    await asyncio.sleep(0.1)

    async with session(address) as client:
        tasks = [asyncio.ensure_future(loop(client)) for _ in range(in_flight)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def idle_connections(port: int, count: int) -> None:
    """Holds up to ``count`` connections that never send a request, reopening each one as
    the server closes it (or refuses it) until cancelled."""

    async def hold() -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=(HUGE_ADDRESS, 0))
            except OSError:
                await asyncio.sleep(0.1)
                continue
            await reader.read()  # until the server closes it (header timeout, or a 429)
            writer.close()
            await asyncio.sleep(0.05)

    tasks = [asyncio.ensure_future(hold()) for _ in range(count)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def probe_health(url: str, interval: float, statuses: list[int]) -> None:
    timeout = aiohttp.ClientTimeout(total=10)
    while True:
        try:
            async with aiohttp.ClientSession(timeout=timeout) as client, client.get(
                    url + "/health") as response:
                statuses.append(response.status)
        except (TimeoutError, aiohttp.ClientError):
            statuses.append(0)
        await asyncio.sleep(interval)


async def loaded_phase(url: str, port: int, huge: tuple[str | None, str],
                       args: argparse.Namespace, statuses: list[int]
                       ) -> tuple[list[float], int, float]:
    """``huge``: the huge tenant's key and source address."""
    huge_done = [0]
    background = [
        asyncio.ensure_future(huge_tenant(url, *huge, args.huge_prompts, args.huge_words,
                                          args.huge_in_flight, huge_done)),
        asyncio.ensure_future(idle_connections(port, args.idle_connections)),
        asyncio.ensure_future(probe_health(url, args.probe_interval, statuses)),
    ]
    await asyncio.sleep(args.warmup)  # let the huge requests fill the engine first
    start = time.perf_counter()
    try:
        ttfts = await small_tenant(url, small_key(args), args.small_requests)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    return ttfts, huge_done[0], time.perf_counter() - start


def summary(ttfts: list[float]) -> dict[str, float]:
    ordered = sorted(ttfts)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(p99 * 1000, 1),
            "slowest_ms": [round(ttft * 1000, 1) for ttft in ordered[-3:][::-1]],
            "slowest_at": sorted(ttfts.index(ttft) for ttft in ordered[-3:])}


def small_key(args: argparse.Namespace) -> str | None:
    return KEYS["small"] if args.tenants == "keys" else None


def huge_identities(args: argparse.Namespace) -> dict[str, tuple[str | None, str]]:
    """Each loaded phase's huge tenant: its key and address (one_tenant: the small one's)."""
    if args.tenants == "keys":
        return {"fair": (KEYS["huge"], HUGE_ADDRESS), "one_tenant": (KEYS["small"], HUGE_ADDRESS)}
    return {"fair": (None, HUGE_ADDRESS), "one_tenant": (None, SMALL_ADDRESS)}


def start_server(extra_flags: list[str], args: argparse.Namespace
                 ) -> tuple[subprocess.Popen[str], str]:
    keys = ["--api-key", *KEYS.values()] if args.tenants == "keys" else []
    trust = ["--forwarded-allow-ips", "127.0.0.1"] if "router" in args.via else []
    return harness.launch_pagedserve(["--model", "tiny", *keys, *SERVER_FLAGS, *trust,
                                      *extra_flags], _START_TIMEOUT_S)


def start_router(replica: str) -> tuple[subprocess.Popen[str], str]:
    process = harness.start([*harness.PAGEDSERVE, "router", "--replica", replica, "--host",
                             "127.0.0.1", "--port", "0", *ROUTER_FLAGS],
                            stderr=subprocess.DEVNULL)
    return process, harness.read_address(process, 60.0, ROUTING_ON)


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    await small_tenant(url, small_key(args), 3)  # warm-up
    solo = await small_tenant(url, small_key(args), args.small_requests)
    phases: dict[str, Any] = {"solo": summary(solo)}
    for name, huge in huge_identities(args).items():
        if name not in args.phases:
            continue
        statuses: list[int] = []
        ttfts, huge_done, seconds = await loaded_phase(url, port, huge, args, statuses)
        loaded = summary(ttfts)
        phases[name] = {**loaded, "huge_requests_done": huge_done,
                        "small_phase_s": round(seconds, 2),
                        "p99_vs_solo": round(loaded["p99_ms"] / phases["solo"]["p99_ms"], 2),
                        "health_probes": len(statuses),
                        "health_probes_ok": sum(s == 200 for s in statuses)}
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer, smaller requests (10 small ones, 16 prompts, 100 idle "
                             "connections) where not given")
    parser.add_argument("--small-requests", type=int, default=None, help="default 40")
    parser.add_argument("--huge-prompts", type=int, default=None, help="default 64")
    parser.add_argument("--huge-words", type=int, default=400)
    parser.add_argument("--huge-in-flight", type=int, default=2)
    parser.add_argument("--idle-connections", type=int, default=None, help="default 300")
    parser.add_argument("--probe-interval", type=float, default=0.2)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--phases", nargs="+", choices=("fair", "one_tenant"),
                        default=["fair", "one_tenant"],
                        help="loaded phases to run after solo (one_tenant is the slow one)")
    parser.add_argument("--server-flags", default="",
                        help="more flags for the server, e.g. '--max-shared-prefill-tokens 64'")
    parser.add_argument("--via", nargs="+", choices=("direct", "router"), default=["direct"],
                        help="straight to the server, through pagedserve router, or both in "
                             "turn")
    parser.add_argument("--tenants", choices=("keys", "addresses"), default="keys",
                        help="tenants by API key (two keys), or by source address (no keys)")
    args = parser.parse_args()
    defaults = (10, 16, 100) if args.quick else (40, 64, 300)
    for name, default in zip(("small_requests", "huge_prompts", "idle_connections"), defaults,
                             strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    process, url = start_server(shlex.split(args.server_flags), args)
    report: dict[str, Any] = {}
    try:
        for via in args.via:
            if via == "direct":
                report[via] = asyncio.run(run(url, args))
                continue
            router, router_url = start_router(url)
            try:
                report[via] = asyncio.run(run(router_url, args))
            finally:
                harness.stop(router)
    finally:
        harness.stop(process)
    if len(report) == 2:
        report["router_vs_direct_p99"] = {
            name: round(report["router"][name]["p99_ms"] / report["direct"][name]["p99_ms"], 2)
            for name in report["direct"]}
    for via, phases in report.items():
        print(f"{via}:")
        for name, numbers in phases.items():
            text = ", ".join(f"{k} {v}" for k, v in numbers.items()) if isinstance(
                numbers, dict) else numbers
            print(f"{name:>12}: {text}")
    print(json.dumps(report if len(args.via) > 1 else report[args.via[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
