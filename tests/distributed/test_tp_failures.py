"""A worker that hangs: the step's collective times out after ``distributed_timeout``, the
step raises WorkerFailedError naming the cause, the worker is killed, and the process leaves
the group (a new tensor-parallel engine can start in it)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch.distributed

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.distributed.errors import WorkerFailedError

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
