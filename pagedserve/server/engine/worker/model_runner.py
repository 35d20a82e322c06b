"""SchedulerOutput → model inputs (``model_input.py``) → hidden states → the logits of the
rows the sampling plan asks for.

Everything a step needs is built here from the scheduler's plain data and passed to the model
explicitly; nothing lives in module-level state.
"""

from __future__ import annotations

import torch

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_input import ModelInput, prepare_model_input
from pagedserve.server.engine.worker.step_timing import StepTimer


class ModelRunner:
    """Runs one engine step's forward pass over the paged KV cache."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, block_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device

    def prepare_input(self, out: SchedulerOutput) -> ModelInput:
        return prepare_model_input(out, self.block_size, self.device)

    def run_block_ops(self, out: SchedulerOutput) -> None:
        # Order matters: swap-out reads blocks that a copy or swap-in may then overwrite.
        if out.blocks_to_swap_out:
            self.kv_cache.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            self.kv_cache.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            self.kv_cache.copy(out.blocks_to_copy)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, rows: list[int],
                timer: StepTimer | None = None) -> torch.Tensor | None:
        """Runs the block ops, the forward pass and the logits of ``rows`` (the sampling
        plan's rows of the step's packed hidden states); returns float32 logits
        [len(rows), vocab], None when no row is asked for. ``timer`` books the block ops and
        packing as ``prepare``, the model and its logits as ``forward``."""
        self.run_block_ops(out)
        inp = self.prepare_input(out) if out.scheduled else None  # else block ops only
        if timer is not None:
            timer.mark("prepare")
        logits = None if inp is None else self.forward(inp, rows)
        if timer is not None:
            timer.mark("forward")
        return logits

    @torch.inference_mode()
    def forward(self, inp: ModelInput, rows: list[int]) -> torch.Tensor | None:
        """The model over ``inp``, then the logits of ``rows`` of its hidden states: what
        every tensor-parallel rank runs too (``step_message.run_step``), so that the
        vocabulary-parallel head's gather meets the other ranks' in the same step."""
        hidden = self.model(inp.input_ids, inp.positions, inp.attn, self.kv_cache.device_caches)
        if not rows:
            return None
        index = torch.tensor(rows, dtype=torch.int64, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index))
