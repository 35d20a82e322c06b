"""Triton implementations of the paged-KV kernel ops, with the signatures of the torch reference
(see docs/internals.md). They compile for CUDA tensors; on the CPU they run only under Triton's
interpreter (TRITON_INTERPRET=1 set before this package is imported). Without a GPU,
``python -m pagedserve.kernels.triton.compile_check`` still compiles them for a CUDA
architecture and checks their shared memory."""

from .cache_ops import copy_blocks, reshape_and_cache
from .decode import paged_attention_decode
from .launch_config import DecodeConfig, PrefillConfig, choose_decode_config, choose_prefill_config
from .prefill import paged_attention_prefill
from .swap import swap_blocks

__all__ = [
    "DecodeConfig",
    "PrefillConfig",
    "choose_decode_config",
    "choose_prefill_config",
    "copy_blocks",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reshape_and_cache",
    "swap_blocks",
]
