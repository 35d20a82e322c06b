"""The one message rank 0 broadcasts per step, and the step every rank then runs on it.

The message carries what the model runner derives from the ``SchedulerOutput``: the packed
model input (token ids, positions, slot mapping, block tables, lengths), the block
operations (swap out, swap in, copy-on-write copies) and the rows whose logits the step
needs. It travels through the CPU group as one pickled object (``broadcast_object_list``),
so a field added to the runner's ``ModelInput`` or to ``AttentionMetadata`` reaches the
workers without a change here. Sequences, sampling parameters and block tables of the
scheduler never leave rank 0.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from pagedserve.server.distributed.group import TensorParallelGroup
from pagedserve.server.engine.model_runner import ModelInput, ModelRunner
from pagedserve.server.engine.scheduler_output import BlockMapping, SchedulerOutput


class StepKind(enum.IntEnum):
    EXECUTE = 1
    SHUTDOWN = 2


@dataclass(slots=True)
class StepMessage:
    kind: StepKind = StepKind.EXECUTE
    model_input: ModelInput | None = None  # None: a step with block operations only
    blocks_to_swap_out: BlockMapping = field(default_factory=list)
    blocks_to_swap_in: BlockMapping = field(default_factory=list)
    blocks_to_copy: BlockMapping = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, out: SchedulerOutput, model_input: ModelInput | None,
           logit_rows: list[int]) -> StepMessage:
        return cls(StepKind.EXECUTE, model_input, list(out.blocks_to_swap_out),
                   list(out.blocks_to_swap_in), list(out.blocks_to_copy), logit_rows)

    def block_ops(self) -> SchedulerOutput:
        """The block operations as the runner takes them: an output with no sequences."""
        return SchedulerOutput(blocks_to_swap_in=self.blocks_to_swap_in,
                               blocks_to_swap_out=self.blocks_to_swap_out,
                               blocks_to_copy=self.blocks_to_copy)


def logit_rows(out: SchedulerOutput, query_start_loc: list[int]) -> list[int]:
    """Rows of the step's hidden states whose logits rank 0 may ask for: the last row of each
    sequence that samples, every row of a request that wants prompt logprobs. Computing them
    inside the step keeps the vocabulary-parallel head in the step's one round of messages."""
    rows: list[int] = []
    for i, item in enumerate(out.scheduled):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if item.seq_group.sampling_params.prompt_logprobs is not None:
            rows.extend(range(start, end))
        elif item.samples:
            rows.append(end - 1)
    return rows


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (through dataclass fields) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: to_device(getattr(value, f.name), device)
                   for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def send_step(message: StepMessage, group: TensorParallelGroup) -> None:
    """Rank 0: broadcasts ``message`` (tensors moved to the CPU for the trip)."""
    dist.broadcast_object_list([to_device(message, torch.device("cpu"))], src=0,
                               group=group.cpu_group)


def receive_step(group: TensorParallelGroup, device: torch.device) -> StepMessage:
    """Ranks but 0: waits for the next message; its tensors arrive on ``device``."""
    holder: list[Any] = [None]
    dist.broadcast_object_list(holder, src=0, group=group.cpu_group)
    return to_device(holder[0], device)


@torch.inference_mode()
def run_step(runner: ModelRunner, message: StepMessage
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What every rank does with a step: the block operations on its own KV shard, the
    forward pass (its all-reduces meet the other ranks'), then the logits of
    ``message.logit_rows``, gathered on rank 0. Returns (hidden states, logits); logits are
    None off rank 0 and when no row is asked for."""
    runner.run_block_ops(message.block_ops())
    inp = message.model_input
    if inp is None:
        return None, None
    hidden = runner.model(inp.input_ids, inp.positions, inp.attn,
                          runner.kv_cache.device_caches)
    if not message.logit_rows:
        return hidden, None
    rows = torch.tensor(message.logit_rows, dtype=torch.int64, device=hidden.device)
    return hidden, runner.model.compute_logits(hidden.index_select(0, rows))
