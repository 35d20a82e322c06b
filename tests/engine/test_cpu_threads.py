"""--cpu-threads: the server leaves one core to its event loop unless told otherwise."""

from __future__ import annotations

import pytest

from pagedserve.server.engine import engine_args as engine_args_module
from pagedserve.server.engine.engine_args import EngineArgs


def test_server_leaves_one_core_to_the_event_loop(monkeypatch):
    monkeypatch.setattr(engine_args_module.os, "cpu_count", lambda: 16)
    assert EngineArgs().for_server().cpu_threads == 15
    monkeypatch.setattr(engine_args_module.os, "cpu_count", lambda: 1)
    assert EngineArgs().for_server().cpu_threads == 1


def test_explicit_threads_and_accelerators_are_left_alone(monkeypatch):
    monkeypatch.setattr(engine_args_module.os, "cpu_count", lambda: 16)
    assert EngineArgs(cpu_threads=16).for_server().cpu_threads == 16
    assert EngineArgs(device="cuda:0").for_server().cpu_threads is None
    assert EngineArgs().cpu_threads is None  # offline: torch's default, one per core


def test_zero_threads_is_a_clear_error():
    from pagedserve.server.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="cpu_threads must be at least 1, got 0"):
        LLMEngine(EngineArgs(cpu_threads=0))
