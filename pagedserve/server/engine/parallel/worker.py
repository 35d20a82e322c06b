"""A worker rank: joins the group, loads its shard, allocates its KV shard, then runs every
step rank 0 broadcasts until told to stop.

``worker_process`` is the entry point of the processes rank 0 spawns; ``serve_worker`` is
also what a rank started by ``torchrun`` runs (``run_launched_worker``).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.server.engine.config.engine_args import EngineArgs, resolve_kv_cache_prefault
from pagedserve.server.engine.config.engine_config import SchedulerConfig
from pagedserve.server.engine.parallel.rendezvous import (
    WORKER_WAIT,
    Rendezvous,
    destroy_group,
    env_rendezvous,
    init_group,
    join_store,
    rank_device,
)
from pagedserve.server.engine.parallel.step_message import StepKind, receive_step, run_step
from pagedserve.server.engine.parallel.watchdog import watch_parent
from pagedserve.server.engine.worker.gpu_memory import MemorySnapshot, gpu_kv_cache_memory
from pagedserve.server.engine.worker.kv_cache import KVCache, resolve_kv_cache_dtype
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import shard_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerInit:
    """What rank 0 tells every worker through the store before it loads anything."""

    args: EngineArgs
    model_dir: str
    num_threads: int


@dataclass(frozen=True, slots=True)
class KVPlan:
    """How rank 0 sizes the KV cache. With ``profile`` (CUDA, sized from
    ``gpu_memory_utilization``) every rank runs the profiling pass in step with rank 0 and
    reports the memory it has left; rank 0 takes the least."""

    profile: bool
    scheduler_config: SchedulerConfig | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True, slots=True)
class KVBlocks:
    """The pool sizes rank 0 chose; every rank allocates the same numbers of blocks."""

    num_device_blocks: int
    num_cpu_blocks: int


def worker_process(rank: int, world_size: int, port: int, parent_pid: int,
                   log_level: int = logging.WARNING) -> None:
    """Entry point of a spawned worker (logging at the engine's level). SIGINT is ignored:
    Ctrl-C reaches the whole process group, and the engine, not the terminal, decides when
    its workers stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level,
                        format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s")
    watch_parent(parent_pid)
    sys.exit(_serve_reporting(lambda: join_store(port, rank, world_size)))


def run_launched_worker() -> int:
    """A rank other than 0 started by an external launcher (``torchrun``): serves steps until
    rank 0 shuts down; returns the exit status."""
    return _serve_reporting(lambda: env_rendezvous(WORKER_WAIT))


def _serve_reporting(connect: Callable[[], Rendezvous]) -> int:
    rdzv: Rendezvous | None = None
    try:
        rdzv = connect()
        serve_worker(rdzv)
        return 0
    except BaseException as exc:  # rank 0 must learn why, whatever it was
        logger.error("tensor-parallel worker failed:\n%s", traceback.format_exc())
        if rdzv is not None:
            with contextlib.suppress(Exception):  # rank 0 may be gone already
                rdzv.set(f"error/{rdzv.rank}", f"{type(exc).__name__}: {exc}")
        return 1


def serve_worker(rdzv: Rendezvous) -> None:
    init: WorkerInit = pickle.loads(rdzv.get("init"))
    device = rank_device(init.args.device, rdzv.local_rank)
    if device.type == "cpu":
        torch.set_num_threads(init.num_threads)
    else:  # fails here, before joining, if the device does not exist
        torch.cuda.set_device(device)
    rdzv.set(f"joined/{rdzv.rank}", b"1")
    group = init_group(rdzv, device, WORKER_WAIT)
    try:
        runner = _build_runner(init, rdzv, group, device)
        rdzv.set(f"ready/{rdzv.rank}", b"1")
        while True:
            message = receive_step(group, device)
            if message.kind == StepKind.SHUTDOWN:
                return
            run_step(runner, message)
    finally:
        destroy_group()


def _build_runner(init: WorkerInit, rdzv: Rendezvous, group: TensorParallelGroup,
                  device: torch.device
                  ) -> ModelRunner:
    args = init.args
    torch.manual_seed(args.seed)
    baseline = MemorySnapshot.of(device) if device.type == "cuda" else None
    model, config = load_model(init.model_dir, dtype=args.dtype, device=device,
                               backend=args.kernel_backend, group=group,
                               quantization=args.quantization,
                               quantized_activations=args.quantized_activations)
    rank_config = shard_config(config, group.world_size)
    plan: KVPlan = pickle.loads(rdzv.get("kv_plan"))
    if plan.profile and plan.scheduler_config is not None and baseline is not None:
        memory = gpu_kv_cache_memory(model, rank_config, plan.scheduler_config,
                                     plan.block_size, plan.gpu_memory_utilization, baseline)
        rdzv.set(f"kv_memory/{rdzv.rank}", str(memory))
    blocks: KVBlocks = pickle.loads(rdzv.get("kv_blocks"))
    kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, model.dtype, model.kernel_ops)
    kv_cache = KVCache(rank_config, args.block_size, blocks.num_device_blocks,
                       blocks.num_cpu_blocks, kv_dtype, device, model.kernel_ops,
                       prefault=resolve_kv_cache_prefault(args.kv_cache_prefault))
    return ModelRunner(model, kv_cache, args.block_size, device)
