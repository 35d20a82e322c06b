"""What ``pagedserve serve`` says once it is up, the facts a vLLM user looks for in its log:
the model and where it runs, the KV cache's size, the scheduler's limits, how many requests
of full context length fit at once, and where to send them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedserve.server.api.config.server_config import ServerConfig
    from pagedserve.server.engine.llm_engine import LLMEngine

MiB = 1 << 20


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """Requests of ``max_model_len`` tokens each that the KV cache holds at once."""
    return num_blocks / math.ceil(max_model_len / block_size)


def startup_lines(engine: LLMEngine, config: ServerConfig, urls: list[str],
                  health_urls: tuple[str, ...] | list[str] = ()) -> list[str]:
    kv = engine.kv_cache
    block_size = engine.cache_config.block_size
    num_tokens = kv.num_device_blocks * block_size
    num_bytes = kv.num_device_blocks * kv.bytes_per_block
    names = config.served_model_names or [engine.args.model]
    sched = engine.scheduler_config
    dtype = str(engine.model.dtype).removeprefix("torch.")
    return [
        f"model: {engine.args.model} ({engine.model_dir}), served as {', '.join(names)}",
        f"dtype: {dtype}, device: {engine.device}, kernels: {engine.model.kernel_ops.name}",
        f"KV cache: {kv.num_device_blocks:,} blocks of {block_size} tokens = {num_tokens:,} "
        f"tokens of {str(kv.dtype).removeprefix('torch.')}, {num_bytes:,} bytes "
        f"({num_bytes / MiB:,.2f} MiB); CPU swap space: "
        f"{kv.num_cpu_blocks:,} blocks",
        *_prefault_lines(kv.prefault_seconds, kv.prefaulting),
        *_tensor_parallel_lines(engine),
        f"max_model_len: {engine.max_model_len:,}, max_num_seqs: {sched.max_num_seqs}, "
        f"max_num_batched_tokens: {sched.max_num_batched_tokens:,}",
        f"maximum concurrency for {engine.max_model_len:,} tokens per request: "
        f"{max_concurrency(kv.num_device_blocks, block_size, engine.max_model_len):.2f}x",
        *(f"listening on {url}" for url in urls),
        *(f"/health and /metrics also on {url}" for url in health_urls),
    ]


def _prefault_lines(seconds: float | None, prefaulting: bool) -> list[str]:
    if prefaulting:
        return ["KV cache prefault: made resident in the background"]
    if seconds is None:
        return []
    return [f"KV cache prefaulted: made resident at start-up in {seconds:.2f} s"]


def _tensor_parallel_lines(engine: LLMEngine) -> list[str]:
    info = engine.parallel_info()
    if info.tensor_parallel_size == 1:
        return []
    config, size = engine.model_config, info.tensor_parallel_size
    return [
        f"tensor parallel size: {size}; each rank holds {config.num_attention_heads // size} "
        f"of {config.num_attention_heads} attention heads, "
        f"{max(1, config.num_key_value_heads // size)} of {config.num_key_value_heads} KV "
        f"heads, and {info.kv_blocks_per_rank:,} KV blocks = {info.kv_bytes_per_rank:,} bytes "
        f"({info.kv_bytes_per_rank / MiB:,.2f} MiB) per rank"
    ]
