"""Run a benchmark as its users do (``python -m benchmarks.<name>`` from the repository root),
and read its result. In-process tests import ``benchmarks.<name>`` (``import_benchmark`` in
conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout: float = 120.0
               ) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<name> args...`` from the repository root."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False)


def last_json_line(completed: subprocess.CompletedProcess[str]) -> dict:
    """The JSON object a benchmark prints as its last line (after a clean exit)."""
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])
