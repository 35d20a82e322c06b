"""Compile every kernel for a CUDA architecture on a machine without a GPU.

The interpreter checks the kernels' arithmetic on the CPU, but not that they compile: the
compiler is stricter (loop-carried types, dot shapes, shared memory). This runs the public ops
on small CPU tensors with Triton's launch replaced by a recorder, then compiles every recorded
launch with ``triton.compile`` for the chosen architecture (Triton ships ptxas: no driver or GPU
is needed) and checks its shared memory against the architecture's per-block limit.

    python -m pagedserve.kernels.triton.compile_check [--arch 90]

Run it without TRITON_INTERPRET. Exit status 0 when every launch compiled and fits.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import cache_ops, decode, prefill
from .checks import AttentionShape
from .launch_config import choose_decode_config
from .runtime import is_interpreted

# Opt-in shared memory per block (bytes) by compute capability.
SHARED_MEMORY_LIMITS = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
H200_SM_COUNT = 132
_POINTER_TYPES = {
    torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32",
    torch.int32: "*i32", torch.int64: "*i64",
}


@dataclass
class Launch:
    """One recorded ``kernel[grid](*args, **kwargs)`` call."""

    kernel: triton.runtime.JITFunction
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def split(self) -> tuple[dict[str, str], dict[str, object], dict[str, object]]:
        """(signature, constexprs, compile options) as ``triton.compile`` takes them."""
        bound = dict(zip(self.kernel.arg_names, self.args))
        bound.update((k, v) for k, v in self.kwargs.items() if k in self.kernel.arg_names)
        options = {k: v for k, v in self.kwargs.items() if k not in self.kernel.arg_names}
        signature: dict[str, str] = {}
        constexprs: dict[str, object] = {}
        for param in self.kernel.params:
            value = bound[param.name]
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                constexprs[param.name] = value
            else:
                signature[param.name] = _scalar_type(value)
        return signature, constexprs, options


def _scalar_type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return _POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


@contextmanager
def recording_launches() -> Iterator[list[Launch]]:
    """Record Triton launches instead of running them; CPU tensors are let through."""
    launches: list[Launch] = []

    def record(kernel, *args, grid, warmup, **kwargs):
        launches.append(Launch(kernel, args, kwargs))

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(triton.runtime.JITFunction, "run", record))
        for module in (decode, prefill, cache_ops):
            stack.enter_context(mock.patch.object(module, "require_launchable", lambda *a: None))
        yield launches


def _attention_inputs(num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks,
                      dtype, num_tokens):
    cache = torch.zeros(2, block_size, num_kv_heads, head_dim, dtype=dtype)
    return dict(
        query=torch.zeros(num_tokens, num_heads, head_dim, dtype=dtype),
        key_cache=cache,
        value_cache=cache.clone(),
        block_tables=torch.zeros(num_seqs, max_blocks, dtype=torch.int32),
        seq_lens=torch.ones(num_seqs, dtype=torch.int32),
    )


def _run_decode(num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks, dtype):
    inputs = _attention_inputs(num_seqs, num_heads, num_kv_heads, head_dim, block_size,
                               max_blocks, dtype, num_seqs)
    shape = AttentionShape(num_heads, num_kv_heads, head_dim, block_size, max_blocks)
    config = choose_decode_config(shape, num_seqs, H200_SM_COUNT, dtype.itemsize)
    decode.paged_attention_decode(**inputs, scale=0.1, config=config)


def _run_prefill(num_heads, num_kv_heads, head_dim, block_size, dtype):
    inputs = _attention_inputs(2, num_heads, num_kv_heads, head_dim, block_size, 64, dtype, 8)
    query_start_loc = torch.tensor([0, 3, 8], dtype=torch.int32)
    prefill.paged_attention_prefill(**inputs, query_start_loc=query_start_loc, scale=0.1)


def _run_cache_ops(dtype):
    cache = torch.zeros(4, 16, 8, 128, dtype=dtype)
    rows = torch.zeros(3, 8, 128, dtype=dtype)
    cache_ops.reshape_and_cache(rows, rows, cache, cache.clone(),
                                torch.tensor([0, -1, 5], dtype=torch.int64))
    cache_ops.copy_blocks([cache], [cache.clone()], torch.tensor([[0, 1]], dtype=torch.int64))


def representative_launches(full: bool = True) -> list[Launch]:
    """The launches the ops make for the shapes that matter. The quick set covers every kernel
    once: split and unsplit decode (Llama-style GQA; a padded head dim with block size 8),
    prefill and the cache ops. The full set adds MHA, MQA-like groups, fp32 caches (IEEE dots)
    and head dims 96 and 256."""
    with recording_launches() as launches:
        _run_decode(1, 32, 8, 128, 16, 512, torch.bfloat16)  # split-K + reduce
        _run_decode(256, 32, 8, 80, 8, 64, torch.float16)
        _run_prefill(32, 8, 128, 16, torch.bfloat16)
        _run_cache_ops(torch.bfloat16)
        if full:
            _run_decode(8, 16, 16, 80, 8, 64, torch.float32)
            _run_decode(4, 32, 4, 256, 32, 64, torch.float16)
            _run_prefill(16, 16, 96, 32, torch.float16)
            _run_prefill(8, 1, 256, 8, torch.float32)
    return launches


def compile_launch(launch: Launch, arch: int) -> int:
    """Compile ``launch`` for sm_``arch``; returns its shared memory in bytes."""
    signature, constexprs, options = launch.split()
    source = ASTSource(launch.kernel, signature, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return compiled.metadata.shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, choices=sorted(SHARED_MEMORY_LIMITS))
    parser.add_argument("--quick", action="store_true", help="each kernel once (about 6 compiles)")
    args = parser.parse_args(argv)
    if is_interpreted(decode._decode_kernel):
        print("compile_check: unset TRITON_INTERPRET, the interpreter compiles nothing",
              file=sys.stderr)
        return 2
    limit = SHARED_MEMORY_LIMITS[args.arch]
    failures, seen = 0, set()
    for launch in representative_launches(full=not args.quick):
        signature, constexprs, _ = launch.split()
        key = (launch.kernel.fn.__name__, repr(sorted(signature.items())), repr(constexprs))
        if key in seen:
            continue
        seen.add(key)
        shared = compile_launch(launch, args.arch)
        fits = shared <= limit
        failures += not fits
        described = ", ".join(f"{k}={v}" for k, v in constexprs.items())
        print(f"{'ok' if fits else 'TOO BIG'} sm_{args.arch} {key[0]}({described}) "
              f"shared={shared}B limit={limit}B")
    print(f"compiled {len(seen)} kernels for sm_{args.arch}, {failures} over the limit")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    sys.exit(main())
