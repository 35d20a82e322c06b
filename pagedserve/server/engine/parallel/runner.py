"""Rank 0's stand-in for the model runner when the model is split across ranks.

``execute`` keeps ``ModelRunner``'s signature, so the engine's step reads the same at any
tensor-parallel size. It packs the step with the wrapped runner, broadcasts it as one
message (with the sampling plan's logit rows), then runs it on rank 0 like every worker
does: block operations, forward pass, and the logits of those rows, gathered here. Any
failure inside the step ends the group and raises ``WorkerFailedError``: the other ranks are
stopped mid-collective and cannot resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.parallel.step_message import StepMessage, run_step
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.engine.worker.step_timing import StepTimer

if TYPE_CHECKING:
    from pagedserve.server.engine.parallel.launcher import WorkerGroup


class TensorParallelRunner:
    def __init__(self, runner: ModelRunner, workers: WorkerGroup) -> None:
        self.runner = runner
        self.workers = workers

    @property
    def kv_cache(self) -> KVCache:
        return self.runner.kv_cache

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    def execute(self, out: SchedulerOutput, rows: list[int], timer: StepTimer | None = None
                ) -> torch.Tensor | None:
        """The step on every rank; returns the logits of ``rows`` gathered on rank 0, as
        ``ModelRunner.execute`` does (``timer`` books the same phases)."""
        self.workers.check_health()
        inp = self.runner.prepare_input(out) if out.scheduled else None
        message = StepMessage.of(out, inp, rows)
        if timer is not None:
            timer.mark("prepare")
        try:
            self.workers.send(message)
            logits = run_step(self.runner, message)
        except BaseException as exc:
            # The ranks are out of step (a collective failed, or Ctrl-C interrupted one):
            # the group cannot be used again either way.
            error = self.workers.fail(exc)
            if isinstance(exc, Exception):
                raise error from exc
            raise
        if timer is not None:
            timer.mark("forward")
        return logits
