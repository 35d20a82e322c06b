"""Moving blocks between the device KV pool and the CPU swap space.

This op is deliberately not a Triton kernel. A GPU kernel cannot dereference pageable host
memory, and even a pinned, mapped pool would be read over PCIe one scattered block at a time by
the SMs. The DMA copy engines do that transfer best, in one large contiguous copy from pinned
memory: so the blocks are gathered into one buffer with ``index_select`` on the side that holds
them, crossed with a single non_blocking copy through pinned staging memory, and scattered with
``index_copy_`` on the other side.
"""

from __future__ import annotations

import torch

from .checks import check_block_mapping


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy block ``src_id`` of pool ``src`` [N1, ...] into block ``dst_id`` of pool ``dst``
    [N2, ...] for every (src_id, dst_id) row of ``block_mapping`` (int64 [K, 2]).

    Device→CPU returns once the CPU pool holds the data; CPU→device is ordered on the current
    CUDA stream, so later kernels on that stream see the blocks.
    """
    _check_pools(src, dst)
    check_block_mapping(block_mapping, src.shape[0], dst.shape[0])
    if block_mapping.shape[0] == 0:
        return
    mapping = block_mapping.cpu()
    src_ids, dst_ids = mapping[:, 0], mapping[:, 1]
    if src.device == dst.device:
        dst.index_copy_(0, dst_ids.to(dst.device), src.index_select(0, src_ids.to(src.device)))
    elif src.device.type == "cuda" and dst.device.type == "cpu":
        _swap_out(src, dst, src_ids, dst_ids)
    elif src.device.type == "cpu" and dst.device.type == "cuda":
        _swap_in(src, dst, src_ids, dst_ids)
    else:
        raise ValueError(
            f"swap_blocks moves blocks between a CUDA pool and a CPU pool, got {src.device} "
            f"and {dst.device}"
        )


def _check_pools(src: torch.Tensor, dst: torch.Tensor) -> None:
    if src.dim() < 1 or src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"pools must share the block shape, got src {tuple(src.shape)} and dst "
            f"{tuple(dst.shape)}"
        )
    if src.dtype != dst.dtype:
        raise TypeError(f"pools must share one dtype, got src {src.dtype} and dst {dst.dtype}")


def _swap_out(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor,
              dst_ids: torch.Tensor) -> None:
    gathered = src.index_select(0, src_ids.to(src.device, non_blocking=True))
    staging = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
    staging.copy_(gathered, non_blocking=True)
    # The host scatter below reads the staging buffer, so the DMA must have landed.
    torch.cuda.current_stream(src.device).synchronize()
    dst.index_copy_(0, dst_ids, staging)


def _swap_in(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor,
             dst_ids: torch.Tensor) -> None:
    staging = torch.empty((src_ids.shape[0], *src.shape[1:]), dtype=src.dtype, pin_memory=True)
    torch.index_select(src, 0, src_ids, out=staging)
    # Pinned memory lets the copy run asynchronously; torch's host allocator keeps the staging
    # buffer alive until the copy engine has read it.
    on_device = staging.to(dst.device, non_blocking=True)
    dst.index_copy_(0, dst_ids.pin_memory().to(dst.device, non_blocking=True), on_device)
