"""Run a benchmark script as its users do (``python benchmarks/<name>.py``), and read its result.

The scripts import their sibling ``kv_sim`` by name, which works because Python puts the
script's folder on the path; in-process tests do the same through the ``import_benchmark``
fixture (conftest.py) for the test's duration only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def run_script(script: str, *args: str, timeout: float = 120.0
               ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False)


def last_json_line(completed: subprocess.CompletedProcess[str]) -> dict:
    """The JSON object a benchmark prints as its last line (after a clean exit)."""
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])
