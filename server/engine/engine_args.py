"""Engine arguments: one flat set of knobs, named as vLLM names them, shared by ``LLM``,
``pagedserve generate`` and ``pagedserve serve``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from pagedserve.server.engine.config import CacheConfig, SchedulerConfig


@dataclass(slots=True)
class EngineArgs:
    model: str = "tiny"
    dtype: str = "auto"
    seed: int = 0
    device: str = "cpu"
    kernel_backend: str | None = None
    skip_tokenizer_init: bool = False
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    swap_space: float = 4.0
    enable_prefix_caching: bool = False
    kv_allocation: str = "paged"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    preemption_mode: str = "auto"
    max_waiting_requests: int | None = None
    tensor_parallel_size: int = 1
    distributed_timeout: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got "
                             f"{self.tensor_parallel_size!r}")
        if not self.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout must be positive (seconds), got "
                             f"{self.distributed_timeout!r}")

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory=self.kv_cache_memory,
            swap_space=self.swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_allocation=self.kv_allocation,
        )

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            preemption_mode=self.preemption_mode,
            max_waiting_requests=self.max_waiting_requests,
        )

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> EngineArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(model=model or "tiny", **kwargs)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("engine")
        g.add_argument("--model", default="tiny",
                       help="a local Hugging Face-format directory, or 'tiny' (the embedded "
                            "random-weight model)")
        g.add_argument("--dtype", default="auto",
                       choices=["auto", "float32", "bfloat16", "float16"])
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--device", default="cpu")
        g.add_argument("--kernel-backend", default=None, choices=["auto", "torch", "triton"])
        g.add_argument("--skip-tokenizer-init", action="store_true",
                       help="load no tokenizer: prompts must be token ids, no text output")
        g.add_argument("--block-size", type=int, default=16)
        size = g.add_mutually_exclusive_group()
        size.add_argument("--num-kv-blocks", type=int, default=None)
        size.add_argument("--kv-cache-memory", type=int, default=None,
                          help="bytes of device memory for the KV cache")
        g.add_argument("--swap-space", type=float, default=4.0, help="GiB of CPU swap space")
        g.add_argument("--enable-prefix-caching", action="store_true")
        g.add_argument("--kv-allocation", default="paged", choices=["paged", "contiguous"])
        g.add_argument("--max-num-seqs", type=int, default=256)
        g.add_argument("--max-num-batched-tokens", type=int, default=2048)
        g.add_argument("--max-model-len", type=int, default=None)
        g.add_argument("--preemption-mode", default="auto",
                       choices=["auto", "recompute", "swap"])
        g.add_argument("--max-waiting-requests", type=int, default=None,
                       help="waiting-queue limit; beyond it requests are refused (HTTP 429)")
        g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                       help="split the model across this many ranks (processes: gloo on "
                            "CPU, NCCL with one GPU each on CUDA); see the README")
        g.add_argument("--distributed-timeout", type=float, default=120.0,
                       help="seconds a tensor-parallel step may wait for a rank before the "
                            "engine declares it hung and stops")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
