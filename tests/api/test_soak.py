"""A short soak of a real ``pagedserve serve`` process (``benchmarks.soak``, bounded to a few
rounds): mixed streamed and plain requests, n 1-4, best_of, beam search, sampled and greedy,
clients hanging up. Nothing is lost, nothing leaks, the engine never dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_loses_nothing_and_leaks_nothing() -> None:
    # One warm-up round (the RSS baseline) and three measured rounds of 60 requests.
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--max-requests", "240", "--duration", "600",
         "--seed", "1"],
        capture_output=True, text=True, timeout=280, check=False, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["requests"] == 240
    assert result["lost_requests"] == 0, completed.stdout
    assert result["completed"] + result["aborted_by_client"] == 240
    assert result["aborted_by_client"] > 0  # the mix did hang up on the server
    assert result["engine_deaths"] == 0
    assert (result["kv_blocks_leaked"], result["num_running_after"],
            result["num_waiting_after"]) == (0, 0, 0)
    assert len(result["rss_mb_samples"]) == 4
    assert result["rss_growth_ratio"] < 1.10
    assert result["server_exit_status"] == 0
