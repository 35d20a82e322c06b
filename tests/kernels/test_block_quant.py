"""The C block-quant kernel (``cpu_block_quant.py``), for every GGUF block type it runs, through
every dot-product path this machine has (AVX-512 VNNI, AVX2, portable), on output counts that
are not multiples of its 16-output groups and row counts that are not multiples of its 8-row
tiles:

- the packed weight reads back exactly as ``gguf.quants.dequantize`` reads the file's blocks
  (random blocks, float16 scales at their extremes included);
- the matmul equals, to float32 rounding, the activation quantized as the kernel quantizes it
  (per block of 32, int8 with a float16-rounded scale or int16, round half to even; the K
  types' int8 activations on the AVX-512 path with the scale of 256 inputs; for the legacy
  types with mins, the block's scaled sum rounded to float16) times the dequantized weight,
  and is within 1.5% (int8) of the float activation's product;
- a weight of row segments of different types runs in one call as each type alone.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import block_quant_paths, cpu_block_quant, native_build
from pagedserve.kernels.block_quant_weight import GGUF_BLOCKS, concat_rows, from_gguf
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.dispatch import cpu_quantized_kernels
from pagedserve.kernels.quantized_linear import (
    REFERENCE,
    choose_kernel,
    dequantize,
    quantize_int4,
    quantize_int8,
)
from tests.gguf_blocks import random_blocks

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.IQ4_NL, T.IQ4_XS]
LEGACY_MINS = (T.Q4_1, T.Q5_1)
K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


@pytest.fixture(params=block_quant_paths.PATHS)
def path(request) -> str:
    if request.param not in cpu_block_quant.cpu_paths():
        pytest.skip(f"this CPU has no {request.param} path")
    return request.param


def _inputs(qtype) -> int:
    return 512 if GGUF_BLOCKS[int(qtype)][1] == 256 else 96


def _weight(qtype, out: int, inp: int, seed: int, extreme: bool = False):
    raw = random_blocks(qtype, out, inp, seed, extreme=extreme)
    return raw, from_gguf(int(qtype), raw, (out, inp))


def _dequantized(qtype, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, qtype).copy())


def test_the_kernels_layout_table_is_the_files() -> None:
    library = cpu_block_quant._library()
    entry = (ctypes.c_int64 * 3)()
    table = {}
    for i in range(library.bq_layout_info(0, entry)):
        library.bq_layout_info(i, entry)
        table[entry[0]] = (entry[1], entry[2])
    assert table == {t: (block, size) for t, (_, block, size) in GGUF_BLOCKS.items()}
    for type_id, (block, size) in table.items():
        assert tuple(gguf.GGML_QUANT_SIZES[T(type_id)]) == (block, size)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_packed_rows_read_back_as_gguf_dequantizes(qtype) -> None:
    raw, weight = _weight(qtype, 37, _inputs(qtype), 1, extreme=True)
    state = BLOCK_QUANT_KERNEL.prepare(weight)
    ids = torch.tensor([36, 0, 17, 17, 5, *range(37)])
    rows = BLOCK_QUANT_KERNEL.lookup(state, ids, torch.float32)
    assert torch.equal(rows, _dequantized(qtype, raw)[ids])


def test_a_row_id_outside_the_weight_is_refused() -> None:
    # The C would read past the packed weight (a crash), and a fused weight's segments would
    # each skip the id and leave its row unwritten.
    (q4k, alone), (q80, tail) = _weight(T.Q4_K, 20, 256, 1), _weight(T.Q8_0, 3, 256, 4)
    table = torch.cat([_dequantized(T.Q4_K, q4k), _dequantized(T.Q8_0, q80)])
    for weight in (alone, concat_rows([alone, tail])):
        state = BLOCK_QUANT_KERNEL.prepare(weight)
        rows = weight.out_features
        for bad in (rows, -1):
            with pytest.raises(IndexError, match=rf"^row ids must lie in \[0, {rows}\), got "):
                BLOCK_QUANT_KERNEL.lookup(state, torch.tensor([0, bad]), torch.float32)
        last = BLOCK_QUANT_KERNEL.lookup(state, torch.tensor([rows - 1]), torch.float32)
        assert torch.equal(last, table[rows - 1 : rows])


def _as_quantized(x: torch.Tensor, bits: int,
                  group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x with each block of 32 quantized as the kernel does (the scale of ``group`` blocks),
    back in float; and per block the error of the scaled sum the legacy mins multiply (rounded
    to float16 for int8)."""
    rows, k = x.shape
    top = 127 if bits == 8 else 32767
    blocks = F.pad(x, (0, -k % (32 * group))).view(rows, -1, 32)
    amax = blocks.abs().view(rows, -1, 32 * group).amax(-1, keepdim=True)
    amax = amax.repeat_interleave(group, dim=1)
    blocks = blocks[:, : -(-k // 32)]
    amax = amax[:, : blocks.shape[1]]
    # a tensor over a tensor: torch divides a Python number by a tensor through the reciprocal,
    # which can round the inverse scale differently from the kernel's top / amax
    q = torch.round(blocks * torch.where(amax > 0, torch.full_like(amax, top) / amax, 0))
    d = amax / top
    sums = q.sum(-1) * d[..., 0]
    if bits == 8:
        d = d.half().float()
        error = sums.half().float().double() - q.sum(-1).double() * d[..., 0].double()
    else:
        error = sums.double() - q.sum(-1).double() * d[..., 0].double()
    return (q * d).view(rows, -1)[:, :k], error


def _check(kernel, qtype, raw: np.ndarray, weight, rows: int, seed: int, bits: int,
           x: torch.Tensor | None = None) -> None:
    if x is None:
        x = torch.randn(rows, weight.in_features, generator=torch.Generator().manual_seed(seed))
    state = kernel.prepare(weight)
    assert state.activation_bits == bits
    y = kernel.linear(x, state, None)
    assert y.shape == (rows, weight.out_features) and y.dtype == torch.float32
    reference = _dequantized(qtype, raw)
    group = cpu_block_quant.activation_group(state.path, int(qtype), bits)
    assert group == (8 if state.path == "vnni" and bits == 8 and qtype in K_TYPES else 1)
    quantized, sum_error = _as_quantized(x, bits, group)
    exact = quantized.double() @ reference.double().T
    if qtype in LEGACY_MINS:  # the mins times the rounding of each block's scaled sum
        blocks = raw.reshape(raw.shape[0], -1, GGUF_BLOCKS[int(qtype)][2])
        mins = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]).double()
        exact += sum_error @ mins.T
    scale = exact.abs().amax(1, keepdim=True)
    atol = 2e-6 if bits == 8 else 3e-5
    torch.testing.assert_close(y.double() / scale, exact / scale, rtol=0, atol=atol)
    plain = x.double() @ reference.double().T
    assert float((y.double() - plain).norm() / plain.norm()) < (0.015 if bits == 8 else 1e-4)


def _awkward_rows(k: int) -> torch.Tensor:
    """Rows whose quantization has edges: ties at half a step, a zero block, negative zeros,
    float16-subnormal scales, the largest floats, an infinity and a NaN."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, k, generator=g)
    x[0] = torch.arange(k) % 32 - 15.5  # amax 16.5: codes at exact halves of a step
    x[1, :32] = 0.0
    x[1, 32:64] = -0.0
    x[2] *= 1e-6
    x[3] *= 1e-40  # denormal inputs
    x[4] = torch.finfo(torch.float32).max * torch.sign(x[4])
    x[5, 3] = float("inf")
    x[6, 40] = float("nan")
    x[7] = torch.round(x[7] * 4) / 4  # quarter steps: many ties after scaling
    return x


@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("k", [64, 70, 2048])  # 70: a last block zero past k
def test_the_vector_quantizer_gives_the_plain_loops_values(bits, k, group) -> None:
    if "vnni" not in cpu_block_quant.cpu_paths():
        pytest.skip("this CPU has no AVX-512 path")
    x = _awkward_rows(k)
    vector = cpu_block_quant.quantize_activations(x, bits, vector=True, group=group)
    plain = cpu_block_quant.quantize_activations(x, bits, vector=False, group=group)
    for a, b in zip(vector, plain, strict=True):
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b)
    # and on the ordinary rows they are the rounding the other tests model (_as_quantized)
    ordinary = [0, 1, 2, 7]
    codes, scales = plain[0][ordinary].float(), plain[1][ordinary]
    blocks = codes.shape[1] // 32
    dequantized = (codes.view(4, blocks, 32) * scales[..., None]).view(4, -1)[:, :k]
    assert torch.equal(dequantized, _as_quantized(x[ordinary], bits, group)[0])


def test_quantize_activations_names_what_it_takes() -> None:
    with pytest.raises(ValueError, match=r"^quantize_activations takes float32 rows \[m, k\], "
                                         r"8 or 16 bits and a group of 1 or 8 blocks, got "
                                         r"torch.float64 \[2, 3\], 8 and 1$"):
        cpu_block_quant.quantize_activations(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"got torch.float32 \[2, 3\], 4 and 1$"):
        cpu_block_quant.quantize_activations(torch.zeros(2, 3), bits=4)
    with pytest.raises(ValueError, match=r"got torch.float32 \[2, 3\], 8 and 4$"):
        cpu_block_quant.quantize_activations(torch.zeros(2, 3), group=4)


@pytest.mark.parametrize("rows", [1, 7, 33, 70])  # 70: two chunks of rows, a partial tile
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_type_matches_its_dequantization(path, qtype, rows) -> None:
    raw, weight = _weight(qtype, 37, _inputs(qtype), rows)
    _check(cpu_block_quant.with_path(path), qtype, raw, weight, rows, rows, 8)


@pytest.mark.parametrize("rows", [2, 8])  # the plain rows' sums, and the tiled ones'
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_the_k_types_sums_hold_at_their_extremes(path, qtype, rows) -> None:
    # Every code +-127 (a block's sum +-4064, the most an int16 pair holds here) against the
    # largest scales and mins: the integer sums of the AVX-512 path neither wrap nor round.
    raw, weight = _weight(qtype, 37, 512, 5, extreme=True)
    signs = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0])[:rows]
    x = signs[:, None] * torch.full((rows, 512), 3.0)
    x[:, 256:288] *= -1  # a block against its neighbours in a pair
    _check(cpu_block_quant.with_path(path), qtype, raw, weight, rows, 0, 8, x)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_int16_activations_match_closer(path, qtype) -> None:
    raw, weight = _weight(qtype, 21, _inputs(qtype), 3)
    _check(cpu_block_quant.with_path(path, "int16"), qtype, raw, weight, 9, 4, 16)


@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_16_bit_weights_stay_16_bit(path, qtype, rows) -> None:
    w = torch.randn(37, 96, generator=torch.Generator().manual_seed(rows))
    stored = w.half() if qtype == T.F16 else w.bfloat16()
    weight = from_gguf(int(qtype), stored.view(torch.uint8), (37, 96))
    kernel = cpu_block_quant.with_path(path)
    state = kernel.prepare(weight)
    assert state.packed.numel() == 48 * 96 * 2  # 16 bits a weight, rows padded to 16
    ids = torch.tensor([36, 0, 17, 17])
    assert torch.equal(kernel.lookup(state, ids, torch.float32), stored.float()[ids])
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1))
    exact = x.double() @ stored.double().T
    y = kernel.linear(x, state, None)
    torch.testing.assert_close(y.double(), exact, rtol=0, atol=1e-5 * float(exact.abs().max()))


@pytest.mark.parametrize(("scheme", "inp"), [("int4", 31), ("int8", 40)])
def test_float_weights_quantized_in_groups_of_32(path, scheme, inp) -> None:
    w = torch.randn(21, inp, generator=torch.Generator().manual_seed(inp))
    weight = quantize_int4(w, 32) if scheme == "int4" else quantize_int8(w, 32)
    kernel = cpu_block_quant.with_path(path)
    x = torch.randn(5, inp, generator=torch.Generator().manual_seed(0))
    y = kernel.linear(x, kernel.prepare(weight), None)
    reference = x @ dequantize(weight).T
    assert float((y - reference).norm() / reference.norm()) < 0.015


def test_row_segments_of_different_types_run_in_one_call(path) -> None:
    parts = [_weight(T.Q4_K, 20, 256, 1), _weight(T.Q6_K, 9, 256, 2), _weight(T.Q4_K, 16, 256, 3),
             _weight(T.Q8_0, 3, 256, 4)]
    kernel = cpu_block_quant.with_path(path)
    fused = kernel.prepare(concat_rows([w for _, w in parts]))
    assert fused.types == ("Q4_K", "Q6_K", "Q8_0")
    x = torch.randn(11, 256, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([kernel.linear(x, kernel.prepare(w), None) for _, w in parts], dim=1)
    assert torch.equal(kernel.linear(x, fused, None), alone)
    ids = torch.tensor([47, 0, 20, 28, 29, 44, 45, 3])
    table = torch.cat([_dequantized(t, raw) for t, (raw, _) in
                       zip([T.Q4_K, T.Q6_K, T.Q4_K, T.Q8_0], parts, strict=True)])
    assert torch.equal(kernel.lookup(fused, ids, torch.float32), table[ids])


@pytest.mark.parametrize("rows", [1, 70])
def test_any_number_of_threads_writes_what_one_thread_writes(path, rows) -> None:
    # More threads than cores and than chunks of groups: every chunk is run once, whoever
    # takes it (a thread's own run from the front, another's from the back).
    parts = [_weight(T.Q4_K, 150, 256, 6), _weight(T.Q6_K, 40, 256, 7), _weight(T.Q8_0, 9, 256, 8)]
    state = cpu_block_quant.with_path(path).prepare(concat_rows([w for _, w in parts]))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(9))
    library = cpu_block_quant._library()
    path_id = block_quant_paths.PATHS.index(path)

    def run(threads: int) -> torch.Tensor:
        y = torch.full((rows, state.out_features), float("nan"))
        library.bq_linear(x.data_ptr(), x.stride(0), rows, *state.call_args, y.data_ptr(),
                          state.out_features, threads, path_id, state.activation_bits)
        return y

    one = run(1)
    assert not one.isnan().any()
    for threads in (2, 3, 7):
        assert torch.equal(run(threads), one)


def test_rows_past_one_slab_are_what_each_row_gives_alone(path) -> None:
    # 8192 inputs: a call takes its rows in slabs of 256 (as many as the kept activation
    # buffer holds); 300 rows cross a slab's end inside a chunk and a tile of rows.
    _, weight = _weight(T.Q4_K, 40, 8192, 10)
    kernel = cpu_block_quant.with_path(path)
    state = kernel.prepare(weight)
    x = torch.randn(300, 8192, generator=torch.Generator().manual_seed(11))
    y = kernel.linear(x, state, None)
    for rows in (slice(0, 1), slice(250, 262), slice(299, 300)):
        assert torch.equal(y[rows], kernel.linear(x[rows], state, None))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_packed_bytes_stay_near_the_files(qtype) -> None:
    raw, weight = _weight(qtype, 64, 2048, 0)
    state = BLOCK_QUANT_KERNEL.prepare(weight)
    assert state.packed.numel() <= 1.04 * raw.nbytes
    assert BLOCK_QUANT_KERNEL.state_nbytes(state) == state.packed.numel() + 32


def test_bias_and_the_callers_dtype() -> None:
    _, weight = _weight(T.Q8_0, 24, 64, 4)
    state = BLOCK_QUANT_KERNEL.prepare(weight)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(24, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(BLOCK_QUANT_KERNEL.linear(x, state, bias),
                               BLOCK_QUANT_KERNEL.linear(x, state, None) + bias)
    assert BLOCK_QUANT_KERNEL.linear(x.bfloat16(), state, bias.bfloat16()).dtype == torch.bfloat16


def test_dispatch_takes_blocks_and_float16_scaled_groups_of_32() -> None:
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    kernels = cpu_quantized_kernels()
    assert choose_kernel(kernels, _weight(T.Q6_K, 16, 256, 0)[1], CPU) is BLOCK_QUANT_KERNEL
    assert choose_kernel(kernels, quantize_int4(w, 32), CPU) is BLOCK_QUANT_KERNEL
    assert choose_kernel(kernels, quantize_int8(w, 32), CPU) is BLOCK_QUANT_KERNEL
    assert choose_kernel(kernels, quantize_int8(w), CPU) is INT8_KERNEL  # per channel
    assert choose_kernel(kernels, quantize_int4(w, 64), CPU) is INT4_KERNEL


def test_off_leaves_every_weight_to_torchs_ops(monkeypatch) -> None:
    monkeypatch.setenv(cpu_block_quant.ENV, "off")
    cpu_block_quant.choice.cache_clear()
    try:
        w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
        assert choose_kernel(cpu_quantized_kernels(), quantize_int4(w, 32), CPU) is INT4_KERNEL
    finally:
        monkeypatch.delenv(cpu_block_quant.ENV)
        cpu_block_quant.choice.cache_clear()


def test_a_forced_path_is_read_once_into_each_weight(monkeypatch) -> None:
    _, weight = _weight(T.Q4_0, 16, 64, 0)
    for path in cpu_block_quant.cpu_paths():
        monkeypatch.setenv(cpu_block_quant.ENV, path)
        cpu_block_quant.choice.cache_clear()
        state = BLOCK_QUANT_KERNEL.prepare(weight)
        monkeypatch.setenv(cpu_block_quant.ENV, "off")
        assert state.path == path and cpu_block_quant.chosen_path() == path
    cpu_block_quant.choice.cache_clear()


def test_where_torchs_int4_op_wins_it_takes_only_the_weights_it_runs(monkeypatch) -> None:
    """Every other type stays with the kernel: none falls back to float."""
    monkeypatch.setattr(cpu_block_quant, "choice", lambda: block_quant_paths.PathChoice(
        cpu_block_quant.cpu_paths()[0], "test", int4_to_torch=True))
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    kernels = cpu_quantized_kernels()
    assert choose_kernel(kernels, quantize_int4(w, 32), CPU) is INT4_KERNEL
    for type_id in (T.Q4_0, T.Q4_1, T.Q4_K):
        assert choose_kernel(kernels, _weight(type_id, 16, 256, 0)[1], CPU) is REFERENCE
    for type_id in (T.Q5_K, T.Q6_K, T.Q8_0, T.Q3_K):
        assert choose_kernel(kernels, _weight(type_id, 16, 256, 0)[1], CPU) is BLOCK_QUANT_KERNEL
    mixed = concat_rows([_weight(T.Q4_K, 16, 256, 0)[1], _weight(T.Q6_K, 16, 256, 1)[1]])
    assert choose_kernel(kernels, mixed, CPU) is BLOCK_QUANT_KERNEL


def _choose(setting: str, available: tuple[str, ...], torch_us: float = 500.0,
            times: dict[str, float] | None = None):
    times = times or {"vnni": 40e-6, "avxvnni": 48e-6, "avx2": 60e-6, "portable": 300e-6}
    return block_quant_paths.choose(setting, available, times.__getitem__,
                                    lambda: {"torch int4 op": torch_us * 1e-6, "float32": 1e-3})


def test_the_choice_is_the_fastest_path_and_says_why(caplog) -> None:
    assert _choose("", ("vnni", "avx2", "portable")) == block_quant_paths.PathChoice(
        "vnni", "CPU flags allow AVX-512 VNNI, AVX2, portable C; timed fastest (AVX-512 VNNI "
                "40 us, AVX2 60 us, portable C 300 us, torch int4 op 500 us, float32 1000 us)")
    assert _choose("auto", ("avx2", "portable")).path == "avx2"
    assert _choose("", ("avxvnni", "avx2", "portable")) == block_quant_paths.PathChoice(
        "avxvnni", "CPU flags allow AVX-VNNI, AVX2, portable C; timed fastest (AVX-VNNI 48 us, "
                   "AVX2 60 us, portable C 300 us, torch int4 op 500 us, float32 1000 us)")
    # within TIE of each other, the flags' order decides: AVX-512 VNNI before AVX-VNNI
    close = {"vnni": 42e-6, "avxvnni": 40e-6, "avx2": 60e-6, "portable": 300e-6}
    assert _choose("", ("vnni", "avxvnni", "avx2"), times=close).path == "vnni"
    assert _choose("avxvnni", ("vnni", "avxvnni", "avx2")).reason == (
        "forced by PAGEDSERVE_BLOCK_QUANT=avxvnni")
    assert _choose("portable", ("vnni", "portable")).reason == (
        "forced by PAGEDSERVE_BLOCK_QUANT=portable")
    shared = _choose("auto", ("avx2", "portable"), torch_us=50.0)
    assert shared == block_quant_paths.PathChoice(
        "avx2", "CPU flags allow AVX2, portable C; torch int4 op timed faster (AVX2 60 us, "
                "portable C 300 us, torch int4 op 50 us, float32 1000 us): it runs the 4-bit "
                "weights it takes, AVX2 the rest", int4_to_torch=True)
    assert _choose("off", ("vnni",)) == block_quant_paths.PathChoice(
        None, "PAGEDSERVE_BLOCK_QUANT=off")
    with caplog.at_level(logging.WARNING):
        assert _choose("vnni", ("avx2", "portable")).path == "avx2"
        assert _choose("sse", ("portable",)).path == "portable"
    assert "PAGEDSERVE_BLOCK_QUANT=vnni: this CPU has no AVX-512 VNNI (it has AVX2, " \
           "portable C); choosing by timing" in caplog.text
    assert "PAGEDSERVE_BLOCK_QUANT='sse' is not one of off, auto, portable, avx2, avxvnni, " \
           "vnni" \
           in caplog.text


def test_a_timed_choice_is_kept_for_the_same_library_and_torch(tmp_path) -> None:
    file = tmp_path / "kernels" / "block_quant-0123.path.json"
    choice = _choose("", ("avx2", "portable"), torch_us=50.0)
    assert block_quant_paths.kept(file, "2.13.0") is None
    block_quant_paths.keep(file, choice, "2.13.0")
    again = block_quant_paths.kept(file, "2.13.0")
    assert again is not None and (again.path, again.int4_to_torch) == ("avx2", True)
    assert again.reason.startswith(choice.reason + "; timed ")
    assert again.reason.endswith(f", kept in {file}")
    assert block_quant_paths.kept(file, "2.14.0") is None  # another torch times again
    file.write_text('{"path": "sse", "reason": "", "torch": "2.13.0", "timed": ""}')
    assert block_quant_paths.kept(file, "2.13.0") is None
    file.write_text("{")
    assert block_quant_paths.kept(file, "2.13.0") is None


def test_a_build_without_the_x86_paths_runs_the_portable_one(tmp_path, monkeypatch) -> None:
    """What an ARM machine builds: the same source with the x86 paths left out."""
    if cpu_block_quant.cpu_paths() == ("portable",):
        pytest.skip("this machine builds the portable path alone anyway")
    raw, weight = _weight(T.Q4_K, 20, 256, 7)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8))
    kernel = cpu_block_quant.with_path("portable")
    expected = kernel.linear(x, kernel.prepare(weight), None)
    target = tmp_path / "block_quant_portable.so"
    subprocess.run([native_build.c_compiler(), *native_build._flags("block_quant"), "-DBQ_X86=0",
                    "-o", str(target), str(native_build.SOURCE_DIR / "block_quant.c")],
                   check=True, capture_output=True)
    library = ctypes.CDLL(str(target))
    for name, (args, result) in cpu_block_quant._SIGNATURES.items():
        getattr(library, name).argtypes, getattr(library, name).restype = args, result
    monkeypatch.setattr(cpu_block_quant, "_library", lambda: library)
    assert cpu_block_quant.cpu_paths() == ("portable",)
    state = cpu_block_quant.with_path("portable").prepare(weight)
    assert torch.equal(BLOCK_QUANT_KERNEL.linear(x, state, None), expected)
    rows = BLOCK_QUANT_KERNEL.lookup(state, torch.arange(20), torch.float32)
    assert torch.equal(rows, _dequantized(T.Q4_K, raw))


def test_a_path_this_cpu_lacks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not 'neon'"):
        cpu_block_quant.with_path("neon")


def test_activation_widths_are_checked_and_named() -> None:
    kernels = (BLOCK_QUANT_KERNEL, INT4_KERNEL)
    assert cpu_block_quant.with_activations(kernels, "int8") == kernels
    wide, torch_op = cpu_block_quant.with_activations(kernels, "int16")
    assert (wide.name, torch_op) == ("block-quant-dot (C, int16 activations)", INT4_KERNEL)
    with pytest.raises(ValueError, match="quantized activations must be one of int8, int16, "
                                         "got 'int4'"):
        cpu_block_quant.with_activations(kernels, "int4")
