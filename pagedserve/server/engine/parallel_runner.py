"""Rank 0's stand-in for the model runner when the model is split across ranks.

``execute`` and ``compute_logits`` keep ``ModelRunner``'s signatures, so the engine's step
reads the same at any tensor-parallel size. ``execute`` packs the step with the wrapped
runner, broadcasts it as one message, then runs it on rank 0 like every worker does: block
operations, forward pass, and the logits of every row the engine may ask for, gathered here.
``compute_logits`` then only picks rows. Any failure inside the step ends the group and
raises ``WorkerFailedError``: the other ranks are stopped mid-collective and cannot resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedserve.server.engine.kv_cache import KVCache
from pagedserve.server.engine.model_runner import ModelRunner
from pagedserve.server.engine.scheduler_output import SchedulerOutput
from pagedserve.server.engine.step_message import StepMessage, logit_rows, run_step
from pagedserve.server.engine.step_timing import StepTimer

if TYPE_CHECKING:
    from pagedserve.server.engine.parallel_launcher import WorkerGroup


class TensorParallelRunner:
    def __init__(self, runner: ModelRunner, workers: WorkerGroup) -> None:
        self.runner = runner
        self.workers = workers
        self._logits: torch.Tensor | None = None
        self._logit_index: dict[int, int] = {}

    @property
    def kv_cache(self) -> KVCache:
        return self.runner.kv_cache

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    def execute(self, out: SchedulerOutput, timer: StepTimer | None = None
                ) -> tuple[torch.Tensor | None, list[int]]:
        """The step on every rank; returns rank 0's hidden states [T, hidden] and the query
        start offsets, as ``ModelRunner.execute`` does (``timer`` books the same phases)."""
        self.workers.check_health()
        inp = self.runner.prepare_input(out) if out.scheduled else None
        starts = inp.query_start_loc if inp is not None else [0]
        rows = logit_rows(out, starts)
        message = StepMessage.of(out, inp, rows)
        if timer is not None:
            timer.mark("prepare")
        try:
            self.workers.send(message)
            hidden, self._logits = run_step(self.runner, message)
        except BaseException as exc:
            # The ranks are out of step (a collective failed, or Ctrl-C interrupted one):
            # the group cannot be used again either way.
            error = self.workers.fail(exc)
            if isinstance(exc, Exception):
                raise error from exc
            raise
        self._logit_index = {row: i for i, row in enumerate(rows)}
        if timer is not None:
            timer.mark("forward")
        return hidden, starts

    def compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """float32 logits [len(rows), vocab], picked from those the step computed."""
        missing = [row for row in rows if row not in self._logit_index]
        if missing or self._logits is None:
            raise RuntimeError(f"rows {missing or rows} were not computed by this step's "
                               f"vocabulary-parallel head")
        index = torch.tensor([self._logit_index[row] for row in rows], dtype=torch.int64,
                             device=self._logits.device)
        return self._logits.index_select(0, index)
