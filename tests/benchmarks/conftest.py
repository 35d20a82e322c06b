from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest
from bench_scripts import BENCHMARKS


@pytest.fixture
def import_benchmark(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """``import_benchmark("sharing")`` imports benchmarks/sharing.py (and its siblings)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module
