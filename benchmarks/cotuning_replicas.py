"""Two replicas of uneven capacity, each alone, behind one pool, and each with a client of its
own (``apart``), for ``cotuning.py``; the cores each replica gets."""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from typing import Any

from benchmarks.cotuning_runs import (
    SHAPES,
    RunResult,
    Shape,
    make_requests,
    merge,
    print_row,
    rounds,
    run_once,
)


async def two_replicas(urls: list[str], model: str, seed: int, num_rounds: int,
                       num_requests: int) -> dict[str, Any]:
    shape = SHAPES["sharegpt"]
    shape = Shape(shape.name, num_requests, shape.input, shape.output)
    print(f"two replicas (auto), {shape.requests} sharegpt requests each alone, "
          f"{2 * shape.requests} together, {num_rounds} rounds", flush=True)
    targets = {"large": urls[:1], "small": urls[1:], "both": urls}
    # The pair gets a batch of each solo run's size per replica, so that every run spends
    # about as long in a steady state before the batch drains (the drain, as the last long
    # answers finish, would otherwise weigh twice as much in the pair's shorter run).
    sizes = {"large": shape.requests, "small": shape.requests, "both": 2 * shape.requests}
    results: dict[str, list[RunResult]] = {}
    for salt, label in enumerate(rounds([*targets, "apart"], num_rounds)):
        if label == "apart":
            # Each replica its own client and batch, both at once: what the two make side by
            # side on this machine, where they share its memory and caches.
            runs = await asyncio.gather(*(run_once(
                targets[name], "auto",
                make_requests(shape, model, seed, salt=seed * 2000 + 100 * salt + i),
                f"apart-{name}") for i, name in enumerate(("large", "small"))))
            for name, run in zip(("apart-large", "apart-small"), runs, strict=True):
                results.setdefault(name, []).append(run)
            continue
        sized = Shape(shape.name, sizes[label], shape.input, shape.output)
        requests = make_requests(sized, model, seed, salt=seed * 2000 + salt)
        result = await run_once(targets[label], "auto", requests, label)
        results.setdefault(label, []).append(result)
    runs = {label: merge(results[label]) for label in results}
    for run in runs.values():
        print_row(run)
    solo = runs["large"].tokens_per_s + runs["small"].tokens_per_s
    apart = runs["apart-large"].tokens_per_s + runs["apart-small"].tokens_per_s
    return {
        "runs": {k: {**asdict(v), "tokens_per_s": v.tokens_per_s} for k, v in runs.items()},
        "two_replicas_vs_sum_of_solo": runs["both"].tokens_per_s / solo,
        "apart_vs_sum_of_solo": apart / solo,
        "two_replicas_vs_apart": runs["both"].tokens_per_s / apart,
        "errors": sum(r.errors for r in runs.values()),
    }


def replica_cores(count: int, threads: int, pin: bool) -> list[set[int] | None]:
    """Cores of their own for each replica (``threads`` each), as replicas on separate
    machines would have: otherwise two servers on one small machine take turns on its cores,
    and the pair cannot reach the sum of what each made alone. None where there are too few
    cores or pinning is off (the client then shares the cores with the servers)."""
    available = sorted(os.sched_getaffinity(0))
    if not pin or count < 2 or len(available) < count * threads:
        return [None] * count
    return [set(available[i * threads:(i + 1) * threads]) for i in range(count)]
