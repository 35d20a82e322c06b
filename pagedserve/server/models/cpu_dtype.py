"""``--dtype auto`` on the CPU: the fastest dtype the processor runs natively, and why.

bfloat16 halves the bytes of weights and KV cache, but only instructions made for it turn that
into speed: AMX tiles (``amx_bf16``) or AVX-512 BF16 dot products (``avx512_bf16``). Without
them oneDNN widens every bfloat16 operand to float32 and back, and bfloat16 runs at about half
the speed of float32 (measured: a random-weight Llama, hidden 512, 8 layers, on 2 AVX-512 cores
without BF16, offline 2,391 tok/s float32 against 1,127 bfloat16). With them it is the other
way round (the embedded tiny model offline, 32 x 64/64 tokens, one thread of an AMD EPYC with
``avx512_bf16``: bfloat16 at 1.7-2.3x float32's tokens/s, three alternating runs). oneDNN's own
``_is_mkldnn_bf16_supported`` answers yes on any AVX-512 core, emulation included, so the flags
are read from the processor itself.

Quantized weights (``--quantization`` other than ``none``) run in float32 whatever the CPU: the
matmuls then read 4-8 bits a weight whatever the activations' dtype, and the block-quant
kernel takes float32 activations. Measured on SmolLM2-135M-Instruct Q4_1
(``benchmarks/vs_peers_gguf.py``, 2 threads of a Zen 4 core pair with ``avx512_bf16``, two
rounds): float32 made 74 / 292 / 358 output tok/s at concurrency 1 / 8 / 32 against
bfloat16's 74 / 236 / 346, and its greedy tokens agree with llama.cpp's on the same file for
longer (median 12.5 leading tokens of 32 over 50 prompts, bfloat16 8).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
QUANTIZED_REASON = ("the weights are quantized: their kernels take float32 activations, and "
                    "bfloat16 ones would only add a rounding")


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first processor in /proc/cpuinfo (empty where there is none,
    e.g. macOS)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose_cpu_dtype(flags: frozenset[str] | None = None, quantized: bool = False) -> DtypeChoice:
    """bfloat16 where the CPU has native bfloat16 matmul instructions and the weights are
    float, float32 otherwise."""
    if quantized:
        return DtypeChoice(torch.float32, QUANTIZED_REASON)
    flags = cpu_flags() if flags is None else flags
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    if native:
        return DtypeChoice(torch.bfloat16, f"the CPU runs bfloat16 natively ({native[0]})")
    capability = torch.backends.cpu.get_cpu_capability()
    return DtypeChoice(
        torch.float32,
        f"the CPU ({platform.machine()}, {capability}) has no native bfloat16 matmul "
        f"instructions ({' / '.join(NATIVE_BF16_FLAGS)}); emulated bfloat16 runs at about "
        f"half the speed of float32",
    )
