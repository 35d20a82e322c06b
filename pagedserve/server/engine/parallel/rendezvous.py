"""How the ranks find each other and form their process groups.

Two ways in, one store: ``pagedserve`` starts the workers itself (rank 0 hosts a TCPStore on
a free local port and hands its address to the processes it spawns), or an external launcher
such as ``torchrun`` starts every rank and sets ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE`` and ``RANK`` (``env://``), which works across nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pagedserve.server.models.parallel_group import TensorParallelGroup

# Store keys; torch.distributed keeps its own keys under other prefixes.
KEY_PREFIX = "pagedserve/"
LOCALHOST = "127.0.0.1"
# A worker waits for the next step for as long as the engine is idle; it learns of rank 0's
# death from its sockets or from the parent watch, not from this timeout.
WORKER_WAIT = timedelta(days=30)


@dataclass(slots=True)
class Rendezvous:
    store: dist.Store
    rank: int
    world_size: int
    local_rank: int

    def set(self, key: str, value: bytes | str) -> None:
        self.store.set(KEY_PREFIX + key, value)

    def get(self, key: str) -> bytes:
        """Blocks until ``key`` is set (up to the store's timeout)."""
        return bytes(self.store.get(KEY_PREFIX + key))

    def has(self, key: str) -> bool:
        return bool(self.store.check([KEY_PREFIX + key]))


def host_store(world_size: int, timeout: timedelta) -> Rendezvous:
    """Rank 0 of workers that pagedserve spawns: a store on a free local port."""
    store = dist.TCPStore(LOCALHOST, 0, world_size, is_master=True, timeout=timeout,
                          wait_for_workers=False)
    return Rendezvous(store, 0, world_size, 0)


def join_store(port: int, rank: int, world_size: int) -> Rendezvous:
    store = dist.TCPStore(LOCALHOST, port, world_size, is_master=False, timeout=WORKER_WAIT)
    return Rendezvous(store, rank, world_size, rank)


def launched_rank() -> int | None:
    """This process's rank when an external launcher started it (``RANK`` and
    ``WORLD_SIZE`` set, more than one rank), else None."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ["RANK"])


def env_rendezvous(timeout: timedelta) -> Rendezvous:
    """Joins the ``env://`` rendezvous that ``torchrun`` (or the user) set up."""
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return Rendezvous(store, rank, world_size, local_rank)


def rank_device(base: torch.device | str, local_rank: int) -> torch.device:
    """The device a rank computes on: its own GPU (``cuda:LOCAL_RANK``), or the CPU."""
    base = torch.device(base)
    if base.type == "cpu":
        return base
    return torch.device(base.type, local_rank)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_group(rdzv: Rendezvous, device: torch.device, timeout: timedelta
               ) -> TensorParallelGroup:
    """Forms this rank's process groups: the tensor group on the device's backend and, on
    CUDA, a gloo group for the step messages (which are CPU objects). ``timeout`` bounds every
    collective this rank waits in, which is how rank 0 detects a hung worker."""
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a torch.distributed group (another "
            "tensor-parallel engine still running?); shut it down first"
        )
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=rdzv.store, rank=rdzv.rank,
                            world_size=rdzv.world_size, timeout=timeout)
    device_group = dist.group.WORLD
    cpu_group = device_group if backend == "gloo" else dist.new_group(backend="gloo",
                                                                      timeout=timeout)
    return TensorParallelGroup(rdzv.rank, rdzv.world_size, device_group, cpu_group)


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
