"""Quantized matmuls on the CPU in C (``csrc/block_quant.c``) for every GGUF block type of
llama.cpp's presets, executed as stored: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL and IQ4_XS, F16 and BF16 kept at 16 bits (widened to float32 in registers and
multiplied by the float activations), a fused projection's row segments of different types
in one call, and a float checkpoint quantized to int4 / int8 in groups of 32 at load (as
Q4_1 / Q8_0).

The weight is repacked once at load, in C on all threads, straight from the file's blocks
into the kernel's packed form (``csrc/bq_layout.h``): 16 output rows interleaved, codes as
bit planes, the file's own float16 scales and integer sub-block scales, so that it takes the
file's bytes (at most 4% more: Q4_K 148 bytes per 256 inputs against 144). Every packed
weight reads back exactly as ``gguf.quants.dequantize`` reads the file (``lookup``: a tied or
untied embedding looks its rows up there).

Each activation row is quantized per block of 32 inputs, one integer dot product per (weight
sub-block, activation block), the scales applied in float32 (``csrc/bq_kernel.h``):

- int8 activations (the default), rounded as GGUF's CPU runtime rounds them (a float16 scale;
  float16 block sums for the legacy types with mins): about 0.5% of each output. A layer's
  output matches an emulation of llama.cpp's own q8_1 x Q4_1 dot product to 1e-7. The K
  types on the AVX-512 path take one scale per 256 inputs, as llama.cpp's Q8_K
  (``activation_group``, ``csrc/bq_vnni_k.h``): 0.81-0.97 of the time at 32 to 512 rows,
  and on SmolLM2 requantized to Q4_K_M the prompt log-probabilities moved 0.079 from the
  dequantized float32 model's on average against 0.062 per block of 32.
  A call with segments of both kinds quantizes its rows both ways.
- int16 activations (``--quantized-activations int16``, :func:`with_activations`): 2e-5 of
  each output from the float32 product of the dequantized weight, about twice the compute.

The dot products run on one of four paths compiled into the one library (AVX-512 VNNI,
AVX-VNNI, AVX2 + FMA, portable C; each thread streams its run of output groups once per
call, the next 2 KiB prefetched), chosen once per process from the CPU's flags and a short timing
(``block_quant_paths.py``, which also reads ``PAGEDSERVE_BLOCK_QUANT``); each prepared
weight carries its path, so a test can run every path the machine has (:func:`with_path`).
Without a C compiler, or where torch's int4 op times faster, or with
``PAGEDSERVE_BLOCK_QUANT=off``, the kernel declines every weight and the dispatch falls back
to torch's ops (``cpu_quantized_linear.py``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedserve.kernels import block_quant_paths, cpu_parallel
from pagedserve.kernels.block_quant_weight import BlockQuantWeight, from_quantized
from pagedserve.kernels.native_build import NativeBuildError, load_library
from pagedserve.kernels.quantized_linear import QuantizedWeight, QuantKernel, quantize_int4
from pagedserve.kernels.weight_arena import ARENA

logger = logging.getLogger(__name__)

ENV = block_quant_paths.ENV
# --quantized-activations: the integer width each activation block is quantized to.
ACTIVATION_BITS = {"int8": 8, "int16": 16}
_PATH_IDS = {path: i for i, path in enumerate(block_quant_paths.PATHS)}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "bq_paths": ([], _I),
    "bq_layout_info": ([_I, _P], _I),
    "bq_packed_bytes": ([_I, _I, _I], _I),
    "bq_repack": ([_I, _P, _I, _I, _I, _P, _I], _I),
    "bq_dequantize_rows": ([_I, _P, _I, _I, _P, _I, _P, _I], None),
    "bq_linear": ([_P, _I, _I, _I, _I, _P, _P, _I, _P, _I, _I, _I, _I], None),
    "bq_quantize": ([_P, _I, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P], None),
    "bq_act_group": ([_I, _I, _I], _I),
}


@functools.cache
def _library() -> ctypes.CDLL | None:
    try:
        library = load_library("block_quant")
    except (NativeBuildError, OSError) as exc:
        logger.warning("block-quantized C kernel unavailable, using torch's ops: %s", exc)
        return None
    for name, (args, result) in _SIGNATURES.items():
        getattr(library, name).argtypes = args
        getattr(library, name).restype = result
    return library


def cpu_paths() -> tuple[str, ...]:
    """The dot-product paths this CPU runs, fastest first (none without the C build)."""
    library = _library()
    return block_quant_paths.cpu_paths(library.bq_paths()) if library is not None else ()


def chosen_path() -> str | None:
    """The path every weight prepared from now on runs (None: the kernel declines), chosen
    once per process and logged with its reason (``block_quant_paths.py``)."""
    return choice().path


@functools.cache
def choice() -> block_quant_paths.PathChoice:
    """The path and what it leaves to torch's ops, chosen once per process."""
    setting = os.environ.get(ENV, "")
    if setting.strip().lower() == "off" or _library() is None:
        return block_quant_paths.PathChoice(None, f"{ENV}=off" if _library() else "not built")
    timed = setting.strip().lower() in ("", "auto")
    picked = block_quant_paths.kept(_kept_file(), torch.__version__) if timed else None
    if picked is None:
        picked = _timed_choice(setting)
        if timed:
            block_quant_paths.keep(_kept_file(), picked, torch.__version__)
    if picked.path is None:
        logger.info("block-quant kernel declines every weight: %s", picked.reason)
    else:
        logger.info("block-quant kernel runs %s: %s", block_quant_paths.LABELS[picked.path],
                    picked.reason)
    return picked


def _timed_choice(setting: str) -> block_quant_paths.PathChoice:
    threads = torch.get_num_threads()
    # On one thread: a call's compute, what tells the paths apart, without the waits of a
    # parallel region on a machine whose cores are busy with other work.
    torch.set_num_threads(1)
    try:
        return block_quant_paths.choose(setting, cpu_paths(), _time_path, _time_others)
    finally:
        torch.set_num_threads(threads)


def _kept_file() -> Path:
    """Beside the library, named after it (its build key included)."""
    library = Path(_library()._name)  # type: ignore[union-attr]
    return library.with_name(f"{library.stem}.path.json")


TORCH_INT4_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})


def available() -> bool:
    """Whether the kernel runs weights in this process (built, chosen, not turned off)."""
    return chosen_path() is not None


@dataclass(frozen=True, slots=True)
class BlockQuantState:
    packed: torch.Tensor  # uint8: every segment's packed form, one after another
    segments: torch.Tensor  # int64 [segments, 4]: ggml type, rows, byte offset, first column
    in_features: int
    padded_in: int  # inputs the blocks cover
    out_features: int
    path: str
    types: tuple[str, ...]
    activation_bits: int = 8
    # What every call passes to C, computed once (a call at one row is mostly overhead).
    call_args: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        args = (self.in_features, self.padded_in, self.packed.data_ptr(),
                self.segments.data_ptr(), self.segments.shape[0])
        object.__setattr__(self, "call_args", args)


def _as_blocks(weight: BlockQuantWeight | QuantizedWeight) -> BlockQuantWeight | None:
    if isinstance(weight, BlockQuantWeight):
        return weight
    return from_quantized(weight) if isinstance(weight, QuantizedWeight) else None


def _runs(weight: BlockQuantWeight) -> bool:
    library = _library()
    return all(library.bq_packed_bytes(s.type_id, s.rows, s.padded_in) > 0
               for s in weight.segments)


def _supports(weight: BlockQuantWeight | QuantizedWeight, device: torch.device) -> bool:
    if device.type != "cpu" or not available():
        return False
    if choice().int4_to_torch and _torch_runs_int4(weight, device):
        return False
    blocks = _as_blocks(weight)
    return blocks is not None and _runs(blocks)


def _torch_runs_int4(weight: BlockQuantWeight | QuantizedWeight, device: torch.device) -> bool:
    """Whether torch's int4 op takes ``weight`` as it is, or as its 4-bit GGUF blocks are
    repacked for it (Q4_0, Q4_1, Q4_K: groups of 32 with a scale and a minimum)."""
    from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL

    if isinstance(weight, QuantizedWeight):
        return INT4_KERNEL.supports(weight, device)
    return all(s.name in TORCH_INT4_TYPES for s in weight.segments)


def _prepare(weight: BlockQuantWeight | QuantizedWeight, activation_bits: int = 8,
             path: str | None = None) -> BlockQuantState:
    library = _library()
    path = path or chosen_path()
    blocks = _as_blocks(weight)
    if library is None or path is None or blocks is None or not _runs(blocks):
        raise ValueError("the block-quant kernel does not run this weight here")
    k = blocks.padded_in_features
    sizes = [library.bq_packed_bytes(s.type_id, s.rows, k) for s in blocks.segments]
    packed = ARENA.take(sum(sizes))  # huge pages under the stream of a decode step
    table, offset, column = [], 0, 0
    threads = torch.get_num_threads()
    for seg, size in zip(blocks.segments, sizes, strict=True):
        raw = seg.raw if seg.raw.stride(-1) == 1 else seg.raw.contiguous()
        library.bq_repack(seg.type_id, raw.data_ptr(), raw.stride(0), seg.rows, k,
                          packed.data_ptr() + offset, threads)
        table.append([seg.type_id, seg.rows, offset, column])
        offset, column = offset + size, column + seg.rows
    return BlockQuantState(packed, torch.tensor(table, dtype=torch.int64), blocks.in_features,
                           k, blocks.out_features, path, blocks.type_names, activation_bits)


def _linear(x: torch.Tensor, state: BlockQuantState, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if rows.dtype != torch.float32:
        rows = rows.float()
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty(rows.shape[0], state.out_features, dtype=torch.float32)
    linear_into(rows, state, y)
    if x.dtype != torch.float32:
        y = y.to(x.dtype)
    if x.dim() != 2:
        y = y.reshape(*x.shape[:-1], state.out_features)
    return y if bias is None else y + bias


def linear_into(rows: torch.Tensor, state: BlockQuantState, out: torch.Tensor) -> None:
    """out = rows W^T, unchecked: float32 rows [m, in_features] whose inner stride is 1, into
    a contiguous float32 out [m, out_features] (the kernel's ``linear`` checks and calls it;
    so does a caller that has checked a whole step's tensors once)."""
    m, n = rows.shape[0], state.out_features
    threads = cpu_parallel.threads_for(m * n * state.in_features // 16)
    _library().bq_linear(rows.data_ptr(), rows.stride(0), m, *state.call_args, out.data_ptr(),
                         n, threads, _PATH_IDS[state.path], state.activation_bits)


def _built_library() -> ctypes.CDLL:
    library = _library()
    if library is None:
        raise RuntimeError("the block-quant C kernel is not built on this machine")
    return library


def activation_group(path: str, type_id: int, bits: int = 8) -> int:
    """How many blocks of 32 inputs share one activation scale where ``path`` runs a weight of
    GGUF type ``type_id`` with ``bits``-bit activations: 8 (256 inputs, as llama.cpp's Q8_K)
    for the K types on the AVX-512 path with int8 activations, else 1."""
    return int(_built_library().bq_act_group(_PATH_IDS[path], type_id, bits))


def quantize_activations(x: torch.Tensor, bits: int = 8, vector: bool = True, group: int = 1,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 rows [m, k] as the kernel quantizes them before its dot products: the codes
    [m, k rounded up to 32] (int8, or int16 for ``bits`` 16), and per block of 32 the scale,
    the scaled sum and the two half sums [m, blocks, 2]. The scale is of ``group`` blocks
    (1, or 8 as ``activation_group`` says), written for each. ``vector`` False takes the
    plain loop where the CPU has the AVX-512 one (``csrc/bq_quantize.h``: the two give the
    same values)."""
    library = _built_library()
    if bits not in (8, 16) or x.dtype != torch.float32 or x.dim() != 2 or group not in (1, 8):
        raise ValueError(f"quantize_activations takes float32 rows [m, k], 8 or 16 bits and "
                         f"a group of 1 or 8 blocks, got {x.dtype} {list(x.shape)}, {bits} "
                         f"and {group}")
    x = x.contiguous()
    m, k = x.shape
    blocks = -(-k // 32)
    codes = torch.empty(m, 32 * blocks, dtype=torch.int8 if bits == 8 else torch.int16)
    scales, sums = torch.empty(2, m, blocks), torch.empty(m, blocks, 2, dtype=torch.int32)
    library.bq_quantize(x.data_ptr(), k, m, k, 32 * blocks, bits, int(vector), group,
                        codes.data_ptr(), scales[0].data_ptr(), scales[1].data_ptr(),
                        sums.data_ptr())
    return codes, scales[0], scales[1], sums


def _nbytes(state: BlockQuantState) -> int:
    return state.packed.numel() + state.segments.numel() * 8


def _lookup(state: BlockQuantState, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Output rows ``ids`` of the weight, dequantized as gguf dequantizes the file's blocks;
    an id outside the weight's rows raises IndexError (the C reads no row it is not given)."""
    ids = ids.reshape(-1).to(torch.int64)
    if len(ids):
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= state.out_features:
            raise IndexError(f"row ids must lie in [0, {state.out_features}), got "
                             f"{low} .. {high}")
    out = torch.empty(len(ids), state.padded_in, dtype=torch.float32)
    table = state.segments.tolist()
    for type_id, rows, offset, column in table:
        mine = None if len(table) == 1 else ((ids >= column) & (ids < column + rows)).nonzero()
        local = ids.contiguous() if mine is None else (ids[mine[:, 0]] - column).contiguous()
        part = out if mine is None else torch.empty(len(local), state.padded_in)
        _library().bq_dequantize_rows(type_id, state.packed.data_ptr() + offset, rows,
                                      state.padded_in, local.data_ptr(), len(local),
                                      part.data_ptr(), cpu_parallel.threads_for(part.numel()))
        if mine is not None:
            out[mine[:, 0]] = part
    out = out if state.in_features == state.padded_in else out[:, : state.in_features]
    return out.to(dtype)


def _time_path(path: str) -> float:
    state = _probe_state(path)
    return sum(block_quant_paths.best_seconds(functools.partial(_linear, x, state, None))
               for x in _probe_inputs())


def _time_others() -> dict[str, float]:
    return {name: sum(block_quant_paths.best_seconds(functools.partial(call, x))
                      for x in _probe_inputs())
            for name, call in _probe_others().items()}


@functools.cache
def _probe_state(path: str) -> BlockQuantState:
    return _prepare(_probe_weight(), path=path)


@functools.cache
def _probe_others() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """torch's int4 op (what runs these weights without this kernel) and float32."""
    from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL

    weight = _probe_weight()
    calls: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    if INT4_KERNEL.supports(weight, torch.device("cpu")):
        state = INT4_KERNEL.prepare(weight)
        calls["torch int4 op"] = lambda x: INT4_KERNEL.linear(x, state, None)
    dense = torch.randn(*block_quant_paths.PROBE_SHAPE,
                        generator=torch.Generator().manual_seed(0))
    calls["float32"] = lambda x: F.linear(x, dense)
    return calls


@functools.cache
def _probe_weight() -> QuantizedWeight:
    gen = torch.Generator().manual_seed(0)
    return quantize_int4(torch.randn(*block_quant_paths.PROBE_SHAPE, generator=gen), 32)


def _probe_inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(rows, block_quant_paths.PROBE_SHAPE[1], generator=gen)
            for rows in block_quant_paths.PROBE_ROWS]


BLOCK_QUANT_KERNEL = QuantKernel("block-quant-dot (C)", _supports, _prepare, _linear, _nbytes,
                                 _lookup)


def with_activations(kernels: Iterable[QuantKernel], activations: str) -> tuple[QuantKernel, ...]:
    """``kernels`` with the block-quant kernel quantizing activations to ``activations``
    (``int8``, its default, or ``int16``); the other kernels as they are."""
    if activations not in ACTIVATION_BITS:
        raise ValueError(f"quantized activations must be one of {', '.join(ACTIVATION_BITS)}, "
                         f"got {activations!r}")
    if activations == "int8":
        return tuple(kernels)
    variant = dataclasses.replace(
        BLOCK_QUANT_KERNEL, name=f"block-quant-dot (C, {activations} activations)",
        prepare=functools.partial(_prepare, activation_bits=ACTIVATION_BITS[activations]))
    return tuple(variant if kernel is BLOCK_QUANT_KERNEL else kernel for kernel in kernels)


def with_path(path: str, activations: str = "int8") -> QuantKernel:
    """The block-quant kernel forced onto ``path`` (one of ``cpu_paths()``): for tests and
    benchmarks that run every path this machine has."""
    if path not in cpu_paths():
        raise ValueError(f"this CPU runs the paths {', '.join(cpu_paths()) or 'none'}, "
                         f"not {path!r}")
    return dataclasses.replace(
        BLOCK_QUANT_KERNEL, name=f"block-quant-dot (C, {path})",
        supports=lambda weight, device: device.type == "cpu" and _as_blocks(weight) is not None,
        prepare=functools.partial(_prepare, activation_bits=ACTIVATION_BITS[activations],
                                  path=path))
