"""--cpu-threads: torch's default unless given; zero is refused."""

from __future__ import annotations

import pytest

from pagedserve.server.engine.config.engine_args import EngineArgs


def test_threads_default_to_torch_and_an_explicit_count_is_kept():
    assert EngineArgs().cpu_threads is None  # torch's default: one per core
    assert EngineArgs(cpu_threads=3).cpu_threads == 3


def test_zero_threads_is_a_clear_error():
    from pagedserve.server.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="cpu_threads must be at least 1, got 0"):
        LLMEngine(EngineArgs(cpu_threads=0))
