"""The engine and the API type-check under ``mypy --strict``, as pyproject's ``[tool.mypy]``
sets it up: the files it names, torch read as Any (tests/test_user_typing.py checks the
client the way its users' code sees it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_engine_and_the_api_type_check_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert (done.returncode, done.stdout.splitlines()) == (0, []), done.stderr
