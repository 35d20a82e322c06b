"""The tensor-parallel group a model's layers communicate through, passed to them explicitly.

A group of size 1 is the single-device case: every collective is the identity, so the same
model code serves both. ``device_group`` carries the tensor collectives (gloo on CPU, NCCL on
CUDA); ``cpu_group`` carries the step messages, which always travel as CPU objects.
Collectives call the process group's own methods, so a group need not be the process's
default one (tests run two ranks as threads of one process). A group of N > 1 without process
groups describes one rank's shard, enough to build and load it but not to run it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(slots=True)
class CommTimer:
    """Seconds rank 0 spent in collectives (waiting for the other ranks included), for the
    benchmark. Off by default: on CUDA an exact figure needs a device sync per collective."""

    enabled: bool = False
    seconds: float = 0.0
    count: int = 0
    bytes: int = 0  # payload handed to the collectives by this rank

    def reset(self) -> None:
        self.seconds, self.count, self.bytes = 0.0, 0, 0


@dataclass(slots=True)
class TensorParallelGroup:
    rank: int = 0
    world_size: int = 1
    device_group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None
    timer: CommTimer = field(default_factory=CommTimer)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.world_size}")

    def _process_group(self) -> dist.ProcessGroup:
        # A group without process groups describes a rank's shard (enough to build and load
        # it) but cannot run it.
        if self.device_group is None:
            raise RuntimeError(f"rank {self.rank} of {self.world_size} has no process group to "
                               f"communicate through (see rendezvous.init_group)")
        return self.device_group

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def shard_range(self, size: int) -> tuple[int, int]:
        """This rank's ``[start, end)`` of ``size`` items split evenly (size divides)."""
        part = size // self.world_size
        return self.rank * part, (self.rank + 1) * part

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums ``tensor`` over the ranks, in place; returns it."""
        if self.world_size == 1:
            return tensor
        start = self._start(tensor)
        self._process_group().allreduce([tensor]).wait()
        self._stop(start, tensor)
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """Rank 0 gets every rank's ``tensor`` concatenated along the last dim (rank order);
        the other ranks get None."""
        if self.world_size == 1:
            return tensor
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)] if (
            self.is_driver) else None
        options = dist.GatherOptions()
        options.rootRank = 0
        start = self._start(tensor)
        self._process_group().gather([parts] if parts is not None else [], [tensor],
                                     options).wait()
        self._stop(start, tensor)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def broadcast_cpu(self, tensor: torch.Tensor) -> None:
        """Rank 0's CPU ``tensor`` into the same-shaped tensor of every other rank (the step
        messages)."""
        if self.cpu_group is None:
            raise RuntimeError(f"rank {self.rank} of {self.world_size} has no process group to "
                               f"communicate through (see rendezvous.init_group)")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.cpu_group.broadcast([tensor], options).wait()

    def _start(self, tensor: torch.Tensor) -> float:
        if not self.timer.enabled:
            return 0.0
        if tensor.is_cuda:  # time the collective, not the kernels queued before it
            torch.cuda.synchronize(tensor.device)
        return time.perf_counter()

    def _stop(self, start: float, tensor: torch.Tensor) -> None:
        if not self.timer.enabled:
            return
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        self.timer.seconds += time.perf_counter() - start
        self.timer.count += 1
        self.timer.bytes += tensor.numel() * tensor.element_size()
