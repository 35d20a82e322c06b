"""Paged-KV kernel ops: a torch reference for every op (``attention``, ``cache_ops``) and the
backend choice (``dispatch``). Triton implementations live in ``pagedserve.kernels.triton``."""

from pagedserve.kernels.dispatch import KernelOps, get_kernel_ops

__all__ = ["KernelOps", "get_kernel_ops"]
