"""The KV cache tensors: per layer, a K and a V pool ``[num_blocks, block_size, num_kv_heads,
head_dim]`` on the device, plus a CPU swap space of the same layout.

The block manager decides which block ids hold what; this class only owns the memory and runs
the block ops (swap in, swap out, copy-on-write copies) through the model's ``KernelOps``.
Pools are allocated uninitialised: the attention kernels never read a slot that was not
written. On the CPU an untouched page costs no memory until its first write, which then pays a
page fault (the kernel zeroes the page; on a virtual machine the host may fault too): measured
as 5% of a fresh server's CPU time in its first workload, and more when a new block's huge page
is touched mid-step. ``prefault`` therefore makes the device pool resident at start-up, as vLLM
does, so that the memory is the process's from the start and a lack of it shows there, not
mid-run; tests turn it off, holding many engines at once. Where Linux populates pages without
writing them (``host_memory.populate``), a thread does it beside the rest of the start-up and
the first requests (the contents never change, so it may overlap their writes): about three
seconds per GiB off a busy machine's start-up. Elsewhere the pools are zeroed before start-up
goes on.
The pools' element type is the model's, or a narrower one (``--kv-cache-dtype``): a float32
model over a 16-bit cache holds twice the tokens in the same memory and reads half the bytes
per decode step, at the 16-bit rounding of K and V. On the CPU's C kernels a float32 model
keeps a float16 cache unless told otherwise (``KernelOps.float32_model_cache_dtype``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from pagedserve.common.host_memory import advise_huge_pages, populate
from pagedserve.kernels.dispatch import KernelOps
from pagedserve.server.engine.config.engine_config import KV_CACHE_DTYPES
from pagedserve.server.models.model_config import DTYPES, ModelConfig

if TYPE_CHECKING:
    from pagedserve.server.engine.config.engine_config import CacheConfig

BlockMapping = Sequence[tuple[int, int]]
logger = logging.getLogger(__name__)


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype,
                           kernel_ops: KernelOps) -> torch.dtype:
    """The KV cache's element type: the one named, or for ``auto`` the model's, except under
    a float32 model whose kernels prefer a narrower cache (the CPU's C kernels: float16)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                         f"{name!r}")
    if name != "auto":
        dtype = DTYPES[name]
    elif model_dtype == torch.float32 and kernel_ops.float32_model_cache_dtype is not None:
        dtype = kernel_ops.float32_model_cache_dtype
    else:
        dtype = model_dtype
    if dtype != model_dtype and not kernel_ops.reads_other_cache_dtypes:
        raise ValueError(
            f"kv_cache_dtype {name} differs from the model's "
            f"{str(model_dtype).removeprefix('torch.')}, which the {kernel_ops.name} kernels "
            f"do not read; use kv_cache_dtype 'auto' or a kernel backend among cpu, inductor, "
            f"torch")
    return dtype


def check_max_model_len(max_model_len: int, num_blocks: int, block_size: int) -> None:
    """Refuses a ``max_model_len`` that one sequence could not reach in a cache of
    ``num_blocks`` blocks."""
    needed = math.ceil(max_model_len / block_size)
    if needed > num_blocks:
        raise ValueError(
            f"max_model_len {max_model_len} needs {needed} KV blocks of {block_size} tokens, "
            f"but the KV cache holds {num_blocks} blocks ({num_blocks * block_size} tokens); "
            "raise num_kv_blocks or kv_cache_memory, or lower max_model_len"
        )


class KVCache:
    def __init__(
        self,
        model_config: ModelConfig,
        block_size: int,
        num_device_blocks: int,
        num_cpu_blocks: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel_ops: KernelOps,
        prefault: bool = False,
    ) -> None:
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.dtype = dtype
        self.device = torch.device(device)
        self.ops = kernel_ops
        self.bytes_per_block = model_config.bytes_per_block(block_size, dtype)
        shape = (block_size, model_config.num_key_value_heads, model_config.head_dim)
        layers = range(model_config.num_hidden_layers)
        self.key_caches = [self._pool(num_device_blocks, shape, self.device) for _ in layers]
        self.value_caches = [self._pool(num_device_blocks, shape, self.device) for _ in layers]
        self.prefault_seconds: float | None = None
        self._prefault_thread: threading.Thread | None = None
        if prefault:
            self._prefault()
        # Pinned host memory makes device↔host copies direct DMA; it only exists with CUDA.
        pin = self.device.type == "cuda"
        cpu = torch.device("cpu")
        self.cpu_key_caches = [self._pool(num_cpu_blocks, shape, cpu, pin) for _ in layers]
        self.cpu_value_caches = [self._pool(num_cpu_blocks, shape, cpu, pin) for _ in layers]

    def _pool(
        self, num_blocks: int, shape: tuple[int, ...], device: torch.device, pin: bool = False
    ) -> torch.Tensor:
        pool = torch.empty((num_blocks, *shape), dtype=self.dtype, device=device, pin_memory=pin)
        if device.type == "cpu" and not pin and device == self.device:
            advise_huge_pages(pool)  # the pool attention reads every step (host_memory.py)
        return pool

    def _prefault(self) -> None:
        """Makes every device pool on the CPU resident: in a thread where the kernel populates
        pages (``prefault_seconds`` is set when it is done; ``wait_prefault``), else by
        writing zeros now. Other devices commit their memory when it is allocated."""
        if self.device.type != "cpu":
            return
        pools = [*self.key_caches, *self.value_caches]
        if not pools:
            return
        start = time.perf_counter()
        # Whether the kernel populates pages, asked of one block here (the whole first pool
        # took 0.06 s of the start-up); the thread then makes every pool resident.
        if not populate(pools[0][:1]):
            for pool in pools:
                pool.zero_()
            self.prefault_seconds = time.perf_counter() - start
            return
        self._prefault_thread = threading.Thread(
            target=self._populate, args=(pools, start), name="kv-cache-prefault",
            daemon=True)
        self._prefault_thread.start()

    def _populate(self, pools: list[torch.Tensor], start: float) -> None:
        short = [i for i, pool in enumerate(pools) if not populate(pool)]
        if short:
            logger.warning("%d of %d KV cache pools could not be made resident at start-up "
                           "(memory short?): their pages are taken as blocks are first written",
                           len(short), len(pools))
        self.prefault_seconds = time.perf_counter() - start
        logger.info("KV cache prefaulted: made resident in %.2f s", self.prefault_seconds)

    @property
    def prefaulting(self) -> bool:
        """Whether the pools are still being made resident."""
        thread = self._prefault_thread
        return thread is not None and thread.is_alive()

    def wait_prefault(self, timeout: float | None = None) -> float | None:
        """Waits for the prefault to finish; its seconds (None when there is none)."""
        if self._prefault_thread is not None:
            self._prefault_thread.join(timeout)
        return self.prefault_seconds

    @classmethod
    def create(
        cls,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel_ops: KernelOps,
    ) -> KVCache:
        """Sizes the pools from ``num_kv_blocks`` / ``kv_cache_memory`` and ``swap_space`` over
        the model's bytes per block; refuses a ``max_model_len`` the device pool cannot hold."""
        bytes_per_block = model_config.bytes_per_block(cache_config.block_size, dtype)
        num_device_blocks = cache_config.resolve_num_blocks(bytes_per_block)
        check_max_model_len(max_model_len, num_device_blocks, cache_config.block_size)
        return cls(
            model_config, cache_config.block_size, num_device_blocks,
            cache_config.num_cpu_blocks(bytes_per_block), dtype, device, kernel_ops,
            prefault=cache_config.prefault,
        )

    @property
    def device_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(K, V) per layer, as the model takes them."""
        return list(zip(self.key_caches, self.value_caches, strict=True))

    def swap_in(self, mapping: BlockMapping) -> None:
        """Copies CPU block ``src`` to device block ``dst`` for each pair, every layer."""
        blocks = self._mapping(mapping, self.num_cpu_blocks, self.num_device_blocks, "swap_in")
        for src, dst in self._pools(self.cpu_key_caches, self.cpu_value_caches,
                                    self.key_caches, self.value_caches):
            self.ops.swap_blocks(src, dst, blocks)

    def swap_out(self, mapping: BlockMapping) -> None:
        """Copies device block ``src`` to CPU block ``dst`` for each pair, every layer."""
        blocks = self._mapping(mapping, self.num_device_blocks, self.num_cpu_blocks, "swap_out")
        for src, dst in self._pools(self.key_caches, self.value_caches,
                                    self.cpu_key_caches, self.cpu_value_caches):
            self.ops.swap_blocks(src, dst, blocks)

    def copy(self, mapping: BlockMapping) -> None:
        """Copies device block ``src`` onto device block ``dst`` (copy-on-write), every layer."""
        blocks = self._mapping(mapping, self.num_device_blocks, self.num_device_blocks, "copy")
        self.ops.copy_blocks(self.key_caches, self.value_caches, blocks.to(self.device))

    @staticmethod
    def _pools(
        src_k: list[torch.Tensor],
        src_v: list[torch.Tensor],
        dst_k: list[torch.Tensor],
        dst_v: list[torch.Tensor],
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [*zip(src_k, dst_k, strict=True), *zip(src_v, dst_v, strict=True)]

    @staticmethod
    def _mapping(mapping: BlockMapping, num_src: int, num_dst: int, op: str) -> torch.Tensor:
        for src, dst in mapping:
            if not (0 <= src < num_src and 0 <= dst < num_dst):
                raise ValueError(
                    f"{op} pair ({src}, {dst}) is out of range: source pool has {num_src} "
                    f"blocks, destination pool {num_dst}"
                )
        return torch.tensor(list(mapping), dtype=torch.int64).view(-1, 2)
