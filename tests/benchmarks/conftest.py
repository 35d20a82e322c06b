from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture
def import_benchmark() -> Callable[[str], ModuleType]:
    """``import_benchmark("sharing")`` imports ``benchmarks.sharing`` (the repository root is
    on the path: pytest's ``pythonpath``)."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")
