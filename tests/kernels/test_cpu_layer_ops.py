"""The C element-wise layer ops (RMSNorm, the residual add with it, SiLU-and-mul, rotary; the
default CPU backend)
against float64 math and the torch reference: float32 and bfloat16, strided inputs (views of
a fused QKV output), row counts on both sides of the threading threshold and with 1-3
threads, and the fallbacks (float16, non-2-D inputs) that must stay the reference."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_layer_ops, cpu_parallel, layer_ops, native_build

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")

# A few-row decode step and a prefill chunk past MIN_PARALLEL_ELEMENTS.
ROWS = [1, 7, 300]
DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Within float32 rounding, or one bfloat16 rounding (relative to the magnitude)."""
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}threads")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(rows, dtype, threads):
    x = _randn(rows, 512, dtype=dtype) * 3
    weight = _randn(512, dtype=dtype, seed=1)
    out = cpu_layer_ops.rms_norm(x, weight, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    x64 = x.double()
    exact = weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    _close(out, exact, dtype)
    _close(out, layer_ops.rms_norm(x, weight, 1e-5), dtype)


def test_rms_norm_reads_a_strided_view():
    wide = _randn(9, 1024)
    x = wide[:, 256:768]  # row stride 1024
    weight = _randn(512, seed=1)
    _close(cpu_layer_ops.rms_norm(x, weight, 1e-6), layer_ops.rms_norm(x, weight, 1e-6),
           torch.float32)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_adds_in_place_then_normalises_the_sum(rows, dtype, threads):
    x = _randn(rows, 512, dtype=dtype) * 3
    residual = _randn(rows, 512, dtype=dtype, seed=2)
    weight = _randn(512, dtype=dtype, seed=1)
    expected_sum = x + residual  # torch's add: the sum the layer's residual stream holds
    reference_residual = residual.clone()
    reference = layer_ops.add_rms_norm_(x, reference_residual, weight, 1e-5)
    out = cpu_layer_ops.add_rms_norm_(x, residual, weight, 1e-5)
    assert torch.equal(residual, expected_sum) and torch.equal(reference_residual, expected_sum)
    assert out.dtype == dtype and out.shape == x.shape
    _close(out, cpu_layer_ops.rms_norm(expected_sum, weight, 1e-5), dtype)
    _close(out, reference, dtype)


def test_add_rms_norm_reads_a_strided_input_and_refuses_a_strided_residual():
    wide = _randn(9, 1024)
    x = wide[:, 256:768]  # row stride 1024, as a view of a wider output
    residual, weight = _randn(9, 512, seed=2), _randn(512, seed=1)
    expected = layer_ops.rms_norm(x + residual, weight, 1e-6)
    _close(cpu_layer_ops.add_rms_norm_(x, residual, weight, 1e-6), expected, torch.float32)
    # A strided residual is not the C kernel's layout: the reference adds into the view.
    strided = _randn(9, 1024, seed=3)
    view = strided[:, :512]
    before = view.clone()
    out = cpu_layer_ops.add_rms_norm_(x, view, weight, 1e-6)
    assert torch.equal(view, before + x)
    assert torch.equal(strided[:, 512:], _randn(9, 1024, seed=3)[:, 512:])
    _close(out, layer_ops.rms_norm(before + x, weight, 1e-6), torch.float32)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(rows, dtype, threads):
    x = _randn(rows, 2 * 352, dtype=dtype) * 4
    out = cpu_layer_ops.silu_and_mul(x)
    assert out.shape == (rows, 352) and out.dtype == dtype
    gate, up = x.double().chunk(2, dim=-1)
    _close(out, gate * torch.sigmoid(gate) * up, dtype)
    _close(out, layer_ops.silu_and_mul(x), dtype)


def test_silu_and_mul_at_the_ends_of_the_float_range():
    """The sigmoid's reciprocal is taken with bit tricks: huge, tiny and infinite gates still
    give what torch gives (0 far below zero, NaN for -inf times 0, the gate itself far above)."""
    gate = torch.tensor([-1e30, -1e4, -100.0, -87.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 1e4,
                         1e30, float("inf"), float("-inf"), float("nan"), -1.0])
    x = torch.cat([gate, torch.full_like(gate, 3.0)]).view(1, -1)
    expected = torch.nn.functional.silu(gate.double()) * 3.0
    torch.testing.assert_close(cpu_layer_ops.silu_and_mul(x)[0].double(), expected,
                               rtol=2e-6, atol=1e-37, equal_nan=True)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_rotates_q_and_k_in_place_and_leaves_v(rows, dtype, threads):
    heads, kv_heads, head_dim = 8, 4, 64
    qkv = _randn(rows, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    angles = torch.rand(rows, head_dim // 2, generator=torch.Generator().manual_seed(2)) * 50
    cos, sin = angles.cos(), angles.sin()
    expected = qkv.clone()
    layer_ops.rotary_(expected, heads + kv_heads, cos, sin)
    before = qkv.clone()

    cpu_layer_ops.rotary_(qkv, heads + kv_heads, cos, sin)

    _close(qkv, expected, dtype)
    rotated = (heads + kv_heads) * head_dim
    assert torch.equal(qkv[:, rotated:], before[:, rotated:])  # v untouched
    x = before[:, :rotated].double().unflatten(-1, (heads + kv_heads, head_dim))
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    c, s = cos.double()[:, None], sin.double()[:, None]
    exact = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(1)
    # bfloat16 rounds each product before the difference: near-cancelling pairs keep an
    # absolute error of a rounding of the products (|x| up to ~4), not a relative one.
    tol = {torch.float32: 2e-6, torch.bfloat16: 4e-2}[dtype]
    torch.testing.assert_close(qkv[:, :rotated].double(), exact, rtol=tol, atol=tol)


def test_the_reference_rotary_matches_rotating_each_head():
    x = _randn(5, 3 * 16)
    angles = torch.rand(5, 8, generator=torch.Generator().manual_seed(3))
    out = x.clone()
    layer_ops.rotary_(out, 2, angles.cos(), angles.sin())
    first = x[:, :16]
    x1, x2 = first[:, :8], first[:, 8:]
    expected = torch.cat((x1 * angles.cos() - x2 * angles.sin(),
                          x2 * angles.cos() + x1 * angles.sin()), dim=-1)
    assert torch.equal(out[:, :16], expected)
    assert torch.equal(out[:, 32:], x[:, 32:])


def test_other_dtypes_and_shapes_take_the_reference():
    x = _randn(4, 64, dtype=torch.float16)
    weight = _randn(64, dtype=torch.float16, seed=1)
    assert torch.equal(cpu_layer_ops.rms_norm(x, weight, 1e-5), layer_ops.rms_norm(x, weight, 1e-5))
    assert torch.equal(cpu_layer_ops.silu_and_mul(x), layer_ops.silu_and_mul(x))
    residual = _randn(4, 64, dtype=torch.float16, seed=2)
    reference_residual = residual.clone()
    assert torch.equal(cpu_layer_ops.add_rms_norm_(x, residual, weight, 1e-5),
                       layer_ops.add_rms_norm_(x, reference_residual, weight, 1e-5))
    assert torch.equal(residual, reference_residual)
    x3 = _randn(2, 3, 64)
    w32 = _randn(64, seed=1)
    assert torch.equal(cpu_layer_ops.rms_norm(x3, w32, 1e-5), layer_ops.rms_norm(x3, w32, 1e-5))


def test_only_large_inputs_wake_threads(threads):
    assert cpu_parallel.threads_for(cpu_parallel.MIN_PARALLEL_ELEMENTS - 1) == 1
    assert cpu_parallel.threads_for(cpu_parallel.MIN_PARALLEL_ELEMENTS) == threads


def test_warm_up_builds_the_library():
    assert cpu_layer_ops.warm_up(torch.float32) >= 0
    assert cpu_layer_ops.warm_up(torch.float16) == pytest.approx(0, abs=1e-3)
