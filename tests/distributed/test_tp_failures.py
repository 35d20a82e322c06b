"""Workers that fail outside a clean kill mid-step (test_tp_server.py has that one): a worker
that hangs makes the step's collective time out after ``distributed_timeout`` and the step
raise WorkerFailedError naming the cause, the worker is killed and the process leaves the
group (a new tensor-parallel engine can start in it); a worker that dies while the engine is
idle is reported by the next health check."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed

from pagedserve.common.engine_errors import WorkerFailedError
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.parallel.launcher import WorkerGroup
from pagedserve.server.models.parallel_group import TensorParallelGroup

TIMEOUT_S = 1.0


@pytest.mark.slow
def test_a_hung_worker_fails_the_step_after_the_timeout(tp_checkpoints: dict[str, Path]
                                                        ) -> None:
    llm = LLM(str(tp_checkpoints["llama"]), dtype="float32", skip_tokenizer_init=True,
              tensor_parallel_size=2, num_kv_blocks=32, distributed_timeout=TIMEOUT_S)
    engine = llm.engine
    try:
        engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
        engine.step()
        (worker,) = engine.workers._processes.values()
        os.kill(worker.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(WorkerFailedError) as info:
            engine.step()
        assert time.monotonic() - start < 10 * TIMEOUT_S
        message = str(info.value)
        assert message.startswith("a tensor-parallel step did not complete on all 2 ranks: ")
        assert "Timed out" in message
        assert not worker.is_alive()
        assert worker.exitcode == -signal.SIGKILL
        with pytest.raises(WorkerFailedError) as again:
            engine.check_health()
        assert str(again.value) == message
        # The group went with the failed engine, so another one can start in this process.
        assert not torch.distributed.is_initialized()
    finally:
        engine.shutdown()


def test_a_worker_that_dies_while_idle_is_reported_at_once() -> None:
    # No step needs to run: the watchdog sees the process exit, and the engine's idle loop
    # (AsyncEngine) calls check_health, which then raises.
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,),
                                                            daemon=True)
    process.start()
    workers = WorkerGroup(TensorParallelGroup(rank=0, world_size=2), torch.device("cpu"),
                          processes={1: process})
    try:
        workers.check_health()
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                workers.check_health()
            except WorkerFailedError as exc:
                assert str(exc) == (f"tensor-parallel worker rank 1 (pid {process.pid}) was "
                                    f"killed by signal SIGKILL")
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the dead worker was not reported")
    finally:
        workers.shutdown()
    assert not process.is_alive()
