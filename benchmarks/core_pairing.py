"""What the machine gives two busy cores at once, against each core alone.

Two replicas pinned to a core each can together reach the sum of what each reaches alone only
if the cores do not slow each other down. On a VM two virtual cores can be hyperthreads of one
physical core, or share a memory channel and last-level cache with each other and with other
tenants; then any two compute-bound processes, servers or not, fall short of that sum. This
measures it with no server and no client: a one-thread float32 matmul loop pinned to each core,
alone and then on both cores at once, and reports both-at-once GFLOP/s over the sum of the
alone ones. ``cotuning.py`` prints it beside the two-replica ratio.

    python -m benchmarks.core_pairing [--cores 0,1] [--seconds 4] [--size 1024]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_LOOP = """
import os, sys, time, torch
torch.set_num_threads(1)
os.sched_setaffinity(0, {int(sys.argv[1])})
n, seconds = int(sys.argv[2]), float(sys.argv[3])
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(3):
    a @ b
start, count = time.perf_counter(), 0
while time.perf_counter() - start < seconds:
    a @ b
    count += 1
print(2 * n**3 * count / (time.perf_counter() - start) / 1e9)
"""


def _start(core: int, size: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _LOOP, str(core), str(size), str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def _gflops(process: subprocess.Popen) -> float:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the matmul loop exited with {process.returncode}")
    return float(out.strip().splitlines()[-1])


def core_pairing(cores: tuple[int, int], size: int = 1024, seconds: float = 4.0) -> dict:
    """GFLOP/s of each core alone, of both at once, and both-at-once over the sum alone."""
    alone = [_gflops(_start(core, size, seconds)) for core in cores]
    together = [_gflops(p) for p in [_start(core, size, seconds) for core in cores]]
    return {"cores": list(cores), "size": size, "alone_gflops": alone,
            "together_gflops": together, "together_vs_sum_alone": sum(together) / sum(alone)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", default=None, help="two core ids (default: the first two)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    available = sorted(os.sched_getaffinity(0))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else available[:2]
    if len(cores) != 2:
        parser.error(f"needs two cores, got {cores}")
    result = core_pairing((cores[0], cores[1]), args.size, args.seconds)
    print(f"cores {cores}: alone {result['alone_gflops'][0]:.1f} and "
          f"{result['alone_gflops'][1]:.1f} GFLOP/s, together {result['together_gflops'][0]:.1f}"
          f" + {result['together_gflops'][1]:.1f} = {result['together_vs_sum_alone']:.2f} of "
          f"the sum alone")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
