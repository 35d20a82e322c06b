"""Paged decode attention on the CPU in C (``csrc/paged_decode.c``), reading KV blocks in place.

Decode attention on a CPU is bound by memory: every step reads each running sequence's whole
K and V. The C kernel reads each row once, in cache order, for all the query heads that share
it, and requests blocks ahead of the one it reads, into L2. Measured on scattered blocks (64
sequences of 96-192 tokens, 8 layers' caches so that K and V come from memory, 2 threads,
float32): 0.71-0.88 ms a layer, 21-28 GB/s of the machine's 26-46 GB/s read bandwidth; 1.24-1.36
ms with the rows requested into L1; the same kernel on a second thread pool beside torch's was
slower still.

Sequences are cut into parts of about equal context, one per torch intra-op thread; with
fewer sequences than threads (one stream) each sequence's KV heads are cut instead, so that
every thread reads its share of the context. The parts run on torch's OpenMP threads
(``cpu_parallel.py``); ctypes releases the GIL for the call. The int32 tables and lengths and
the cuts are derived once per step and reused by every layer while the tables and lengths
they came from are unchanged. float32 and bfloat16 run here, and a float32 query over a
bfloat16 or float16 cache (each row widened to float32 as it is read); other dtypes take the
compiled kernel. A step whose sequences are all short runs its prefill rows here too, each
row as a decode query of its own length (``ROW_WISE_MAX_LEN``); longer ones keep the
reference path (SDPA), their decode rows here.
``rotary_cache_decode`` takes a float32 model's decode step from its QKV rows: rotary
embedding, KV write and attention in the one call.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import time
from dataclasses import dataclass

import torch

from pagedserve.kernels import attention, compiled_attention, cpu_parallel
from pagedserve.kernels.native_build import load_library

# (query dtype, cache dtype): a float32 model may keep a bfloat16 KV cache (half the bytes).
_FUNCTIONS = {(torch.float32, torch.float32): "paged_decode_f32",
              (torch.bfloat16, torch.bfloat16): "paged_decode_bf16",
              (torch.float32, torch.bfloat16): "paged_decode_f32_bf16kv",
              (torch.float32, torch.float16): "paged_decode_f32_f16kv"}
_ARGTYPES = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 5
             + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64])
# Parts per thread, taken as threads come free (csrc/paged_decode.c). Four parts measured no
# faster than one on an idle machine (57.8 against 59.5 ms a step, interleaved).
PARTS_PER_THREAD = 1


# A float32 model's decode step from its fused QKV rows, by cache dtype (``rotary_cache_decode``).
_FUSED = {torch.float32: "rope_cache_decode_f32", torch.bfloat16: "rope_cache_decode_f32_bf16kv",
          torch.float16: "rope_cache_decode_f32_f16kv"}
# The cache dtypes whose fused decode runs in C.
FUSED_CACHE_DTYPES = frozenset(_FUSED)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_FUSED_ARGTYPES = ([_P, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P] + [_I] * 5
                   + [ctypes.c_float, _P, _I, _I, _I])


@functools.cache
def _fused_kernel(cache_dtype: torch.dtype):
    function = getattr(load_library("paged_decode"), _FUSED[cache_dtype])
    function.argtypes, function.restype = _FUSED_ARGTYPES, ctypes.c_int
    return function


@functools.cache
def _kernel(dtypes: tuple[torch.dtype, torch.dtype]):
    function = getattr(load_library("paged_decode"), _FUNCTIONS[dtypes])
    function.argtypes, function.restype = _ARGTYPES, ctypes.c_int
    return function


@dataclass(frozen=True, slots=True)
class _StepLayout:
    """What every layer of a decode step passes the kernel alike, derived once per step: the
    int32 tables and lengths and the parts the threads take."""

    block_size: int
    num_kv_heads: int
    threads: int
    tables: torch.Tensor  # int32, contiguous, a copy
    lens: torch.Tensor
    parts: torch.Tensor  # int64 [P, 4]: first and end sequence, first and end KV head

    def serves(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
               num_kv_heads: int, threads: int) -> bool:
        # Equal contents, not the same tensors: a caller may rewrite its tensors in place.
        return (self.block_size == block_size and self.threads == threads
                and self.num_kv_heads == num_kv_heads and _same_contents(seq_lens, self.lens)
                and _same_contents(block_tables, self.tables))


@functools.cache
def _memcmp():
    """The C library's memcmp, or None where the process has no C library to name."""
    try:
        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


def _same_contents(given: torch.Tensor, kept: torch.Tensor) -> bool:
    """Whether ``given`` holds ``kept``'s values (an int32 contiguous copy): byte for byte where
    ``given`` is laid out alike (what the engine passes: a few times cheaper than
    ``torch.equal`` on a step's small tables, which every layer compares), else by value."""
    if given.shape != kept.shape:
        return False
    memcmp = _memcmp()
    if (memcmp is not None and given.dtype is torch.int32 and given.is_cpu
            and given.is_contiguous()):
        return memcmp(given.data_ptr(), kept.data_ptr(), 4 * kept.numel()) == 0
    return torch.equal(given, kept)


# The last step's layout: a model's layers all pass the same tables and lengths in one step.
_last_layout: list[_StepLayout] = []


def decode_parts(lens: torch.Tensor, num_kv_heads: int, threads: int) -> list[list[int]]:
    """The work of a decode step cut for ``threads`` threads: runs of sequences of about equal
    context, or where there are fewer sequences than threads, each sequence's KV heads in
    ranges of about equal size. Rows: [first sequence, end sequence, first KV head, end KV
    head]."""
    num_seqs = lens.shape[0]
    if num_seqs >= threads or num_kv_heads == 1:
        bounds = cpu_parallel.balanced_bounds(lens, PARTS_PER_THREAD * threads)
        return [[a, b, 0, num_kv_heads] for a, b in itertools.pairwise(bounds)]
    ranges = min(num_kv_heads, -(-threads // num_seqs))
    cuts = [num_kv_heads * i // ranges for i in range(ranges + 1)]
    return [[s, s + 1, a, b] for s in range(num_seqs) for a, b in itertools.pairwise(cuts)]


def _step_layout(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                 num_kv_heads: int, threads: int) -> _StepLayout:
    layout = _last_layout[0] if _last_layout else None
    if layout is not None and layout.serves(block_tables, seq_lens, block_size, num_kv_heads,
                                            threads):
        return layout
    attention.max_seq_len(seq_lens, block_tables, block_size)
    lens = seq_lens.to(torch.int32, copy=True).contiguous()
    parts = torch.tensor(decode_parts(lens, num_kv_heads, threads), dtype=torch.int64)
    layout = _StepLayout(block_size, num_kv_heads, threads,
                         block_tables.to(torch.int32, copy=True).contiguous(), lens, parts)
    _last_layout[:] = [layout]
    return layout


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_decode`."""
    dtypes = (query.dtype, key_cache.dtype)
    if dtypes not in _FUNCTIONS or not query.is_cpu:
        return compiled_attention.paged_attention_decode(query, key_cache, value_cache,
                                                         block_tables, seq_lens, scale)
    shapes = (query.shape, key_cache.shape, value_cache.shape, block_tables.shape,
              seq_lens.shape)
    if shapes != _checked_shapes[0]:  # every layer of a step passes the same shapes
        attention.check_decode(query, key_cache, value_cache, block_tables, seq_lens)
        _checked_shapes[0] = shapes
    elif not (key_cache.is_cpu and value_cache.is_cpu and block_tables.is_cpu
              and seq_lens.is_cpu):
        attention.check_decode(query, key_cache, value_cache, block_tables, seq_lens)
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous [N, B, Hkv, D] tensors")
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    threads = torch.get_num_threads()
    layout = _step_layout(block_tables, seq_lens, block_size, num_kv_heads, threads)
    query = query.contiguous()
    out = torch.empty_like(query)
    tables, parts = layout.tables, layout.parts
    if _kernel(dtypes)(query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                       tables.data_ptr(), layout.lens.data_ptr(), out.data_ptr(), num_heads,
                       num_kv_heads, head_dim, block_size, tables.shape[1], scale,
                       parts.data_ptr(), parts.shape[0], threads):
        raise MemoryError("paged decode attention could not allocate its score buffer")
    return out


# The shapes last checked by attention.check_decode, which every layer of a step would repeat.
_checked_shapes: list[tuple[tuple[int, ...], ...] | None] = [None]


def rotary_cache_decode(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """A decode-only step's rotary embedding, KV write and attention from its fused QKV rows
    in one call: ``rotary_(qkv, num_heads + num_kv_heads, cos, sin)``, then
    ``reshape_and_cache`` of its K and V heads into ``slot_mapping``, then
    ``paged_attention_decode`` of its query heads; returns out [S, H, D]. A float32 model
    over a float32, bfloat16 or float16 cache runs in C (each thread's part rotates, writes
    and attends its own heads); anything else runs those three ops."""
    step = FusedDecodeStep.of(qkv, num_heads, num_kv_heads, cos, sin, key_cache, value_cache,
                              slot_mapping, block_tables, seq_lens, scale)
    if step is None:
        return _composed_decode(qkv, num_heads, num_kv_heads, cos, sin, key_cache, value_cache,
                                slot_mapping, block_tables, seq_lens, scale)
    out = torch.empty(qkv.shape[0], num_heads, key_cache.shape[-1], dtype=torch.float32)
    step.run(qkv, key_cache, value_cache, out)
    return out


@dataclass(frozen=True, slots=True)
class FusedDecodeStep:
    """``rotary_cache_decode``'s checks of one step, done once: ``run`` then takes each
    layer's QKV rows and caches, which must be shaped, typed and laid out as the checked
    ones (a model's layers are alike), unchecked."""

    cos: torch.Tensor
    sin: torch.Tensor
    slot_mapping: torch.Tensor
    layout: _StepLayout
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_slots: int
    scale: float

    @classmethod
    def of(cls, qkv: torch.Tensor, num_heads: int, num_kv_heads: int, cos: torch.Tensor,
           sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
           scale: float) -> FusedDecodeStep | None:
        """The checked step, or None where the C call does not run these tensors; raises
        what ``paged_attention_decode`` raises for tensors that disagree."""
        num_seqs, width = qkv.shape[0], qkv.shape[-1]
        head_dim = key_cache.shape[-1]
        if not (qkv.is_cpu and qkv.dtype is torch.float32 and key_cache.dtype in _FUSED
                and qkv.dim() == 2 and qkv.stride(1) == 1 and cos.dtype is torch.float32
                and cos.is_contiguous() and sin.is_contiguous()
                and slot_mapping.dtype is torch.int64 and slot_mapping.is_contiguous()
                and width >= (num_heads + 2 * num_kv_heads) * head_dim
                and cos.shape == (num_seqs, head_dim // 2)
                and slot_mapping.shape == (num_seqs,)):
            return None
        shapes = ((num_seqs, num_heads, head_dim), key_cache.shape, value_cache.shape,
                  block_tables.shape, seq_lens.shape)
        if shapes != _checked_shapes[0] or not (key_cache.is_cpu and value_cache.is_cpu
                                                and block_tables.is_cpu and seq_lens.is_cpu):
            query = qkv[:, : num_heads * head_dim].view(num_seqs, num_heads, head_dim)
            attention.check_decode(query, key_cache, value_cache, block_tables, seq_lens)
            _checked_shapes[0] = shapes
        if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
            raise ValueError("the KV caches must be contiguous [N, B, Hkv, D] tensors")
        block_size = key_cache.shape[1]
        layout = _step_layout(block_tables, seq_lens, block_size, num_kv_heads,
                              torch.get_num_threads())
        return cls(cos, sin, slot_mapping, layout, num_heads, num_kv_heads, head_dim,
                   key_cache.shape[0] * block_size, scale)

    def run(self, qkv: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            out: torch.Tensor) -> None:
        """One layer's call, into a contiguous float32 out [S, H, D]."""
        layout, slot_mapping = self.layout, self.slot_mapping
        tables, parts = layout.tables, layout.parts
        failed = _fused_kernel(key_cache.dtype)(
            qkv.data_ptr(), qkv.stride(0), self.cos.data_ptr(), self.sin.data_ptr(),
            slot_mapping.data_ptr(), self.num_slots, key_cache.data_ptr(),
            value_cache.data_ptr(), tables.data_ptr(), layout.lens.data_ptr(), out.data_ptr(),
            self.num_heads, self.num_kv_heads, self.head_dim, layout.block_size,
            tables.shape[1], self.scale, parts.data_ptr(), parts.shape[0], layout.threads,
            qkv.shape[0])
        if failed == 2:
            bad = int(torch.nonzero(slot_mapping >= self.num_slots)[0])
            raise IndexError(f"slot_mapping[{bad}] = {int(slot_mapping[bad])} is out of range "
                             f"for a cache of {self.num_slots} slots")
        if failed:
            raise MemoryError("paged decode attention could not allocate its score buffer")


def _composed_decode(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, cos: torch.Tensor,
                     sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    from pagedserve.kernels import cpu_cache_ops, cpu_layer_ops

    head_dim = key_cache.shape[-1]
    cpu_layer_ops.rotary_(qkv, num_heads + num_kv_heads, cos, sin)
    q, k, v = qkv[:, : (num_heads + 2 * num_kv_heads) * head_dim].split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q = q.view(-1, num_heads, head_dim)
    k, v = k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)
    cpu_cache_ops.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
    return paged_attention_decode(q, key_cache, value_cache, block_tables, seq_lens, scale)


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_prefill`. Where
    every sequence is short (``ROW_WISE_MAX_LEN``) each query row runs the C decode kernel as
    a query of its own; otherwise the reference path runs, its decode rows in C."""
    if ((query.dtype, key_cache.dtype) in _FUNCTIONS and query.is_cpu
            and int(seq_lens.max()) <= ROW_WISE_MAX_LEN):
        return _row_wise_prefill(query, key_cache, value_cache, block_tables, query_start_loc,
                                 seq_lens, scale)
    return attention.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
        decode=paged_attention_decode,
    )


# The longest sequence whose prefill runs row by row. Row i of a prompt sees its sequence's
# positions up to its own, which is a decode query of that length: the decode kernel reads
# those rows again for each query row, where SDPA reads each block once but pays more per
# block. Measured on 2 threads, float16 cache, 32 query and 8 KV heads of 64, milliseconds a
# layer (SDPA / row by row): 16 prompts of 128 tokens 34.7 / 19.4, 8 of 256 52.3 / 40.1,
# 2 of 512 39.9 / 39.1, one of 1024 70.2 / 111.8, 256 new tokens after 768 cached 37.1 / 101.8.
ROW_WISE_MAX_LEN = 256


def _row_wise_prefill(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                      seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Every query row as a decode query: its sequence's table, and as length the position
    it sits at plus one."""
    attention.check_prefill(query, key_cache, value_cache, block_tables, query_start_loc,
                            seq_lens)
    rows = query.shape[0]
    query_lens = attention.query_lengths(query_start_loc, seq_lens, rows).long()
    sequence = torch.repeat_interleave(torch.arange(seq_lens.shape[0]), query_lens)
    # Row t of sequence s (rows start .. end - 1) sits at position seq_len - (end - t).
    ends = query_start_loc[1:].long()[sequence]
    lens = seq_lens.long()[sequence] - (ends - torch.arange(rows))
    return paged_attention_decode(query, key_cache, value_cache, block_tables[sequence],
                                  (lens + 1).to(torch.int32), scale)


def warm_up(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> float:
    """Builds the C kernel for this machine now (once; later processes load it), or compiles
    the inductor kernel for a dtype the C kernel does not take; returns the seconds spent."""
    if (dtype, dtype) not in _FUNCTIONS:
        return compiled_attention.warm_up(num_heads, num_kv_heads, head_dim, block_size, dtype)
    start = time.perf_counter()
    try:
        _kernel((dtype, dtype))  # one library holds every dtype pair
    except Exception as exc:
        raise RuntimeError(
            f"building the CPU attention kernel failed ({exc}); run with --kernel-backend "
            "inductor or torch (or PAGEDSERVE_KERNEL_BACKEND=torch)"
        ) from exc
    return time.perf_counter() - start
