"""Rank 0's side of tensor parallelism: start (or meet) the workers, form the group, hand them
the KV pool size, watch them, stop them.

Tensor parallelism as the PagedAttention paper draws it: one scheduler and block manager
(rank 0, the engine's own process) and N-1 workers, each holding a Megatron-style shard of
the model and its heads' share of every KV block under the same block tables, joined in a
``torch.distributed`` group (gloo on CPU, NCCL on CUDA). The other ``parallel_*`` modules and
``step_message`` are its parts; docs/internals.md draws the step.

``WorkerGroup.start`` with ``tensor_parallel_size == 1`` starts nothing: its group has one
rank, and the engine runs exactly as on a single device.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.multiprocessing as mp

from pagedserve.common.engine_errors import WorkerFailedError
from pagedserve.server.engine.config.engine_args import EngineArgs, resolve_device
from pagedserve.server.engine.config.engine_config import SchedulerConfig
from pagedserve.server.engine.parallel.rendezvous import (
    Rendezvous,
    destroy_group,
    env_rendezvous,
    host_store,
    init_group,
    launched_rank,
    rank_device,
)
from pagedserve.server.engine.parallel.runner import TensorParallelRunner
from pagedserve.server.engine.parallel.step_message import StepKind, StepMessage, send_step
from pagedserve.server.engine.parallel.watchdog import WorkerWatchdog, describe_exit
from pagedserve.server.engine.parallel.worker import KVBlocks, KVPlan, WorkerInit, worker_process
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.models.loader import default_quantization, resolve_dtype
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import check_tensor_parallel
from pagedserve.server.models.source import load_config

logger = logging.getLogger(__name__)

# Loading a large shard takes minutes; a worker that dies meanwhile is noticed at once.
STARTUP_TIMEOUT_S = 1800.0
_POLL_S = 0.02
_JOIN_S = 5.0


class WorkerGroup:
    def __init__(self, group: TensorParallelGroup, device: torch.device,
                 rdzv: Rendezvous | None = None,
                 processes: dict[int, BaseProcess] | None = None,
                 num_threads: int | None = None) -> None:
        self.group = group
        self.device = device
        self._rdzv = rdzv
        self._processes = processes or {}
        self._failure: str | None = None
        self._planned = False  # the workers know how the KV cache is sized
        self._ready = False  # every worker waits in the step loop
        self._closed = group.world_size == 1
        self._restore_threads = num_threads
        self._watchdog = WorkerWatchdog(self._processes,
                                        weakref.WeakMethod(self._on_worker_exit))
        if self._processes:
            self._watchdog.start()
        # An engine dropped without shutdown(), or whose start-up failed after the workers
        # came up, still takes its workers and its group with it.
        self._finalizer = weakref.finalize(self, _release, list(self._processes.values()),
                                           group.world_size > 1)

    @property
    def size(self) -> int:
        return self.group.world_size

    # -- start-up -------------------------------------------------------------------------

    @classmethod
    def start(cls, args: EngineArgs, model_dir: Path) -> WorkerGroup:
        """Rank 0: validates the split, starts the workers (or meets those an external
        launcher started), forms the group. Workers then load their shards while rank 0
        loads its own."""
        size = args.tensor_parallel_size
        base = resolve_device(args.device)
        if size == 1 and launched_rank() is None:
            return cls(TensorParallelGroup(), base)
        config = load_config(model_dir)
        check_tensor_parallel(config, size)
        timeout = timedelta(seconds=args.distributed_timeout)
        launched = launched_rank() is not None
        if base.type == "cuda" and not launched and size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs, one per rank; "
                             f"this machine has {torch.cuda.device_count()}")
        rdzv = env_rendezvous(timeout) if launched else host_store(size, timeout)
        if rdzv.world_size != size:
            raise ValueError(f"WORLD_SIZE {rdzv.world_size} from the environment does not "
                             f"match tensor_parallel_size {size}")
        if rdzv.rank != 0:
            raise ValueError(f"the engine runs on rank 0; rank {rdzv.rank} must run the "
                             f"worker loop (pagedserve serve / generate do so under torchrun)")
        device = rank_device(base, rdzv.local_rank)
        threads = torch.get_num_threads()
        per_rank = max(1, threads // size) if not launched else threads
        init = WorkerInit(_resolved(args, config, device, model_dir), str(model_dir), per_rank)
        rdzv.set("init", pickle.dumps(init))
        processes = {} if launched else _spawn(rdzv, size)
        group = None
        try:
            _wait_for(rdzv, processes, "joined", "join the group")
            group = init_group(rdzv, device, timeout)
        finally:
            if group is None:
                _kill(list(processes.values()))
        if device.type == "cpu" and not launched:
            torch.set_num_threads(per_rank)  # the ranks share this machine's cores evenly
        logger.info("tensor parallel: %d ranks on %s (%s), %d threads per rank", size,
                    device.type, "torchrun" if launched else "spawned workers", per_rank)
        return cls(group, device, rdzv, processes, threads)

    @property
    def _store(self) -> Rendezvous:
        """The store the ranks meet in; a group with workers always has one."""
        if self._rdzv is None:
            raise RuntimeError("a single-rank group has no rendezvous store")
        return self._rdzv

    def agree_kv_memory(self, profile: Callable[[], int], scheduler_config: SchedulerConfig,
                        block_size: int, gpu_memory_utilization: float) -> int:
        """The KV memory every rank can afford: ``profile()`` runs here while each worker
        runs the same pass on its shard (the pass all-reduces, so all ranks must run it)."""
        if self.size == 1:
            return profile()
        plan = KVPlan(True, scheduler_config, block_size, gpu_memory_utilization)
        self._store.set("kv_plan", pickle.dumps(plan))
        self._planned = True
        mine = profile()
        _wait_for(self._store, self._processes, "kv_memory", "measure its memory")
        theirs = [int(self._store.get(f"kv_memory/{rank}")) for rank in range(1, self.size)]
        return min(mine, *theirs)

    def finish_startup(self, kv_cache: KVCache) -> None:
        """Tells the workers the pool sizes rank 0 chose for its KV shard; returns once every
        rank has its model shard and a KV cache of the same number of blocks."""
        if self.size > 1:
            if not self._planned:
                self._store.set("kv_plan", pickle.dumps(KVPlan(False)))
            blocks = KVBlocks(kv_cache.num_device_blocks, kv_cache.num_cpu_blocks)
            self._store.set("kv_blocks", pickle.dumps(blocks))
            try:
                _wait_for(self._store, self._processes, "ready", "load its shard")
            except BaseException:
                self.shutdown()
                raise
            self._ready = True
        mib = kv_cache.num_device_blocks * kv_cache.bytes_per_block / 2**20
        logger.info("KV cache per rank: %d blocks of %d tokens (%d tokens, %.1f MiB on %s), "
                    "%d CPU swap blocks; tensor parallel size %d",
                    kv_cache.num_device_blocks, kv_cache.block_size,
                    kv_cache.num_device_blocks * kv_cache.block_size, mib, self.device,
                    kv_cache.num_cpu_blocks, self.size)

    def wrap(self, runner: ModelRunner) -> ModelRunner | TensorParallelRunner:
        """The runner the engine calls: ``runner`` itself on one rank, else rank 0's driver
        that runs each step on every rank."""
        return runner if self.size == 1 else TensorParallelRunner(runner, self)

    # -- health ---------------------------------------------------------------------------

    def _on_worker_exit(self, rank: int, process: BaseProcess) -> None:
        if self._closed:
            return
        self._failure = (f"tensor-parallel worker rank {rank} (pid {process.pid}) "
                         f"{describe_exit(process.exitcode)}")
        logger.error("%s; stopping the other workers", self._failure)
        # The ranks still running would wait in a collective with the dead one.
        _kill(list(self._processes.values()))

    def check_health(self) -> None:
        """Raises WorkerFailedError once a worker is known to be gone."""
        if self._failure is not None:
            raise WorkerFailedError(self._failure)

    def fail(self, exc: BaseException) -> WorkerFailedError:
        """A step's collective failed: ends the group and returns the error to raise."""
        deadline = time.monotonic() + 1.0
        while self._failure is None and self._processes and time.monotonic() < deadline:
            time.sleep(_POLL_S)  # let the watchdog name the worker that died, if one did
        if self._failure is None:
            self._failure = (f"a tensor-parallel step did not complete on all {self.size} "
                             f"ranks: {exc}")
        self._closed = True
        self._watchdog.stop()
        _kill(list(self._processes.values()))
        # Released now, not when this object is collected: by then the process may belong to
        # another engine's group.
        self._finalizer.detach()
        if self.device.type == "cpu":
            destroy_group()  # a failed NCCL group may hang in its teardown; the process ends
        logger.error("%s", self._failure)
        return WorkerFailedError(self._failure)

    # -- the step -------------------------------------------------------------------------

    def send(self, message: StepMessage) -> None:
        send_step(message, self.group)

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stops the workers (a SHUTDOWN message, then a kill for any that lingers) and
        leaves the group. Idempotent."""
        if self.size == 1:
            return
        failed = self._closed
        self._closed = True
        self._watchdog.stop()
        if self._ready and not failed:
            try:
                send_step(StepMessage(StepKind.SHUTDOWN), self.group)
                for process in self._processes.values():
                    process.join(timeout=_JOIN_S)
            except Exception as exc:  # the workers are killed below anyway
                logger.warning("could not tell the workers to stop: %s", exc)
        _kill(list(self._processes.values()))
        self._finalizer.detach()
        if not failed:
            destroy_group()
        if self._restore_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self._restore_threads)


def _resolved(args: EngineArgs, config: ModelConfig, device: torch.device,
              model_dir: Path) -> EngineArgs:
    # Every rank must run in the same dtype on the same kind of device; "auto" is resolved
    # once, here.
    quantization = default_quantization(model_dir, args.quantization)
    dtype = resolve_dtype(args.dtype, config, device, quantization)
    return replace(args, dtype=str(dtype).removeprefix("torch."), device=device.type)


def _spawn(rdzv: Rendezvous, size: int) -> dict[int, BaseProcess]:
    context = mp.get_context("spawn")
    port = rdzv.store.port
    processes: dict[int, BaseProcess] = {}
    for rank in range(1, size):
        # daemon: the interpreter's exit terminates them even if shutdown() never ran.
        args = (rank, size, port, os.getpid(), logging.getLogger().getEffectiveLevel())
        process = context.Process(target=worker_process, args=args,
                                  name=f"pagedserve-tp-worker-{rank}", daemon=True)
        process.start()
        processes[rank] = process
    return processes


def _wait_for(rdzv: Rendezvous, processes: dict[int, BaseProcess], key: str,
              what: str) -> None:
    """Waits until every worker has set ``key/<rank>``; fails fast when one reports an error
    or exits."""
    pending = set(range(1, rdzv.world_size))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while pending:
        for rank in sorted(pending):
            if rdzv.has(f"error/{rank}"):
                detail = rdzv.get(f"error/{rank}").decode(errors="replace")
                raise WorkerFailedError(
                    f"tensor-parallel worker rank {rank} failed to {what}: {detail}")
            process = processes.get(rank)
            if process is not None and not process.is_alive() and not rdzv.has(
                    f"error/{rank}"):
                raise WorkerFailedError(
                    f"tensor-parallel worker rank {rank} (pid {process.pid}) "
                    f"{describe_exit(process.exitcode)} before it could {what}")
            if rdzv.has(f"{key}/{rank}"):
                pending.discard(rank)
        if time.monotonic() > deadline:
            raise WorkerFailedError(
                f"tensor-parallel ranks {sorted(pending)} did not {what} within "
                f"{STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(_POLL_S)


def _release(processes: list[BaseProcess], owns_group: bool) -> None:
    _kill(processes)
    if owns_group:
        destroy_group()


def _kill(processes: list[BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=_JOIN_S)
