"""The one message rank 0 broadcasts per step, and the step every rank then runs on it.

The message carries what the model runner derives from the ``SchedulerOutput``: the packed
model input (token ids, positions, slot mapping, block tables, lengths), the block operations
(swap out, swap in, copy-on-write copies) and the rows whose logits the step needs (the
engine's ``SamplingPlan.logit_rows``). It travels through the CPU group packed into one uint8
tensor: a small pickled skeleton (the dataclasses' fields, tensors replaced by offsets)
followed by the tensors' bytes, so a field added to the runner's ``ModelInput`` or to
``AttentionMetadata`` reaches the workers without a change here, without pickling tensors (a
millisecond a message). Sequences, sampling parameters and the scheduler's block tables never
leave rank 0.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

from pagedserve.server.engine.core.scheduler_output import BlockMapping, SchedulerOutput
from pagedserve.server.engine.worker.model_input import ModelInput
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.models.parallel_group import TensorParallelGroup


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


@dataclass(frozen=True, slots=True)
class _TensorRef:
    """Where a tensor's bytes sit in the packed payload."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _strip(value: Any, parts: list[torch.Tensor], offset: list[int]) -> Any:
    """``value`` with each tensor replaced by a reference into ``parts`` and each dataclass by
    (class, fields): what is left pickles in microseconds, unlike tensors."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        ref = _TensorRef(offset[0], data.numel(), value.dtype, tuple(value.shape))
        parts.append(data)
        parts.append(torch.zeros(_pad(data.numel()), dtype=torch.uint8))
        offset[0] += data.numel() + _pad(data.numel())
        return ref
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (_DATACLASS, type(value), {f.name: _strip(getattr(value, f.name), parts, offset)
                                          for f in dataclasses.fields(value) if f.init})
    return value


def _rebuild(value: Any, payload: torch.Tensor, device: torch.device) -> Any:
    if isinstance(value, _TensorRef):
        data = payload[value.offset:value.offset + value.nbytes]
        return data.view(value.dtype).reshape(value.shape).to(device)
    if isinstance(value, tuple) and len(value) == 3 and value[0] == _DATACLASS:
        return value[1](**{k: _rebuild(v, payload, device) for k, v in value[2].items()})
    return value


_DATACLASS = "pagedserve.dataclass"
_ALIGN = 8  # every tensor starts at a multiple of the widest element size


def _pad(nbytes: int) -> int:
    return -nbytes % _ALIGN


def pack(message: StepMessage) -> tuple[torch.Tensor, int]:
    """``message`` as one uint8 tensor (a pickled skeleton, padding, every tensor's bytes) and
    the skeleton's length."""
    parts: list[torch.Tensor] = []
    skeleton = pickle.dumps(_strip(message, parts, [0]), protocol=pickle.HIGHEST_PROTOCOL)
    head = torch.frombuffer(bytearray(skeleton + bytes(_pad(len(skeleton)))), dtype=torch.uint8)
    return torch.cat([head, *parts]), len(skeleton)


def unpack(body: torch.Tensor, skeleton_len: int, device: torch.device) -> StepMessage:
    skeleton = pickle.loads(body[:skeleton_len].numpy().tobytes())
    message = _rebuild(skeleton, body[skeleton_len + _pad(skeleton_len):], device)
    if not isinstance(message, StepMessage):
        raise TypeError(f"a step message was expected, got {type(message).__name__}")
    return message


def send_step(message: StepMessage, group: TensorParallelGroup) -> None:
    """Rank 0: broadcasts ``message`` as two tensors, its sizes then its packed bytes."""
    body, skeleton_len = pack(message)
    group.broadcast_cpu(torch.tensor([skeleton_len, body.numel()], dtype=torch.int64))
    group.broadcast_cpu(body)


def receive_step(group: TensorParallelGroup, device: torch.device) -> StepMessage:
    """Ranks but 0: waits for the next message; its tensors arrive on ``device``."""
    sizes = torch.empty(2, dtype=torch.int64)
    group.broadcast_cpu(sizes)
    skeleton_len, total = sizes.tolist()
    body = torch.empty(total, dtype=torch.uint8)
    group.broadcast_cpu(body)
    return unpack(body, skeleton_len, device)


def run_step(runner: ModelRunner, message: StepMessage) -> torch.Tensor | None:
    """What every rank does with a step: the block operations on its own KV shard, then
    ``ModelRunner.forward`` (its all-reduces meet the other ranks') with the logits of
    ``message.logit_rows``, gathered on rank 0. Returns those logits; None off rank 0 and
    when no row is asked for."""
    runner.run_block_ops(message.block_ops())
    if message.model_input is None:
        return None
    return runner.forward(message.model_input, message.logit_rows)
