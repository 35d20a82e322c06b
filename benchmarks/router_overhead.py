"""What the router itself costs: latency it adds and streams per second it passes, against a
backend that answers at once (``benchmarks/fake_backend.py``, its own process).

Added latency: one request at a time for ``--seconds``, direct to the backend and through
``pagedserve router`` in front of it, alternating for ``--rounds`` rounds in one run; the
figures are the medians over the rounds of each side's p50 and p99, and added = routed - direct.
Throughput: ``--connections`` streams at a time through the router for ``--seconds`` (and
direct, for scale); each stream is four SSE events and ``[DONE]``.

The load generator is ``wrk`` (Debian's ``wrk`` package) when it is on PATH: a C client on one
thread that costs the router's cores little, so the router is what saturates. Without it the
run falls back to an aiohttp client in this process, which on a small machine saturates before
the router does: its figures are then lower bounds, and the report says which client ran
(``load_generator``). ``wrk`` is a benchmark tool only, never a dependency.

    python -m benchmarks.router_overhead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.harness import PAGEDSERVE, free_port, read_address, start, stop

STREAM_BODY = ('{"model":"tiny","prompt":"You are a helpful assistant. Answer briefly. '
               'What is the capital of France?","max_tokens":4,"stream":true}')
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def start_backend() -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    process = start([sys.executable, "-m", "benchmarks.fake_backend", str(port)])
    return process, read_address(process, 30.0, ready="fake backend on ")


def start_router(backend: str, *flags: str) -> tuple[subprocess.Popen[str], str]:
    process = start([*PAGEDSERVE, "router", f"--replica={backend}", "--host", "127.0.0.1",
                     "--port", "0", *flags], stderr=subprocess.DEVNULL)
    return process, read_address(process, 60.0, ready="pagedserve: routing on ")


# -- wrk --------------------------------------------------------------------------------------


def wrk(url: str, connections: int, seconds: int, script: Path) -> dict[str, float]:
    """p50 and p99 in ms, requests/s and failed requests of one ``wrk`` run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
         url + "/v1/completions"], capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def parse_wrk(out: str) -> dict[str, float]:
    """The figures in ``wrk --latency``'s report."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)$", out, re.MULTILINE)
    if rps is None:
        raise ValueError(f"not a wrk report: {out!r}")
    result = {"rps": float(rps.group(1))}
    for percentile in ("50", "99"):
        found = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)$", out, re.MULTILINE)
        if found is None:
            raise ValueError(f"no {percentile}th percentile in the wrk report: {out!r}")
        result[f"p{percentile}_ms"] = float(found.group(1)) * _UNITS[found.group(2)]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                              r"timeout (\d+)", out)
    result["failed"] = (int(non_2xx.group(1)) if non_2xx else 0) + (
        sum(int(n) for n in socket_errors.groups()) if socket_errors else 0)
    return result


def wrk_script(directory: str) -> Path:
    path = Path(directory) / "post.lua"
    path.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                    f"wrk.body = '{STREAM_BODY}'\n")
    return path


# -- the aiohttp fallback ---------------------------------------------------------------------


async def _client_run(url: str, connections: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal failed
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            async with http.post(url + "/v1/completions", data=STREAM_BODY,
                                 headers={"Content-Type": "application/json"}) as response:
                await response.read()
                failed += response.status != 200
            latencies.append(1000 * (time.perf_counter() - began))

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as http:
        began = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(connections)))
        elapsed = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100)
    return {"rps": len(latencies) / elapsed, "p50_ms": statistics.median(latencies),
            "p99_ms": cuts[98], "failed": failed}


def client_run(url: str, connections: int, seconds: float) -> dict[str, float]:
    return asyncio.run(_client_run(url, connections, seconds))


# -- the run ----------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, object]:
    use_wrk = shutil.which("wrk") is not None and not args.no_wrk
    backend, direct = start_backend()
    router, routed = start_router(direct, *args.router_flag)
    try:
        with tempfile.TemporaryDirectory() as directory:
            script = wrk_script(directory)

            def run(url: str, connections: int) -> dict[str, float]:
                if use_wrk:
                    return wrk(url, connections, args.seconds, script)
                return client_run(url, connections, args.seconds)

            run(routed, args.connections)  # warm both, and the router's pool
            load_before = os.getloadavg()[0]
            sequential = {"direct": [], "routed": []}  # type: dict[str, list[dict[str, float]]]
            for _ in range(args.rounds):
                for side, url in (("direct", direct), ("routed", routed)):
                    sequential[side].append(run(url, 1))
            streams_direct = run(direct, args.connections)
            streams_routed = run(routed, args.connections)
            load_after = os.getloadavg()[0]
    finally:
        stop(router)
        stop(backend)

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in sequential[side])

    report: dict[str, object] = {
        "load_generator": "wrk" if use_wrk else "aiohttp (wrk not found: figures are lower "
                          "bounds, the client saturates first)",
        "cpus": os.cpu_count(), "load_average_1m": [round(load_before, 2),
                                                    round(load_after, 2)],
    }
    for key in ("p50_ms", "p99_ms"):
        report[f"direct_{key}"] = round(median("direct", key), 3)
        report[f"routed_{key}"] = round(median("routed", key), 3)
        report[f"added_{key}"] = round(median("routed", key) - median("direct", key), 3)
    report["direct_streams_per_s"] = round(streams_direct["rps"], 1)
    report["routed_streams_per_s"] = round(streams_routed["rps"], 1)
    report["routed_streams_p50_ms"] = round(streams_routed["p50_ms"], 3)
    report["failed"] = int(sum(r["failed"] for side in sequential.values() for r in side)
                           + streams_direct["failed"] + streams_routed["failed"])
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=int, default=5, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating direct / routed sequential runs")
    parser.add_argument("--connections", type=int, default=64,
                        help="streams at a time for the throughput run")
    parser.add_argument("--no-wrk", action="store_true",
                        help="use the aiohttp client even when wrk is installed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--router-flag", action="append", default=[],
                        help="passed to pagedserve router (repeat)")
    print(json.dumps(measure(parser.parse_args())))


if __name__ == "__main__":
    main()
