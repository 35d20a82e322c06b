"""Backend choice: auto by device, forced backends, the environment default, import failure."""

from __future__ import annotations

import sys

import pytest

from pagedserve.kernels import (
    attention,
    cache_ops,
    compiled_attention,
    cpu_attention,
    cpu_cache_ops,
    cpu_layer_ops,
    dispatch,
    layer_ops,
)
from pagedserve.kernels.dispatch import BACKEND_ENV, TORCH_OPS, KernelOps, get_kernel_ops


def test_torch_backend_is_the_reference():
    ops = get_kernel_ops("cpu", "torch")
    assert ops is TORCH_OPS
    assert ops.name == "torch" and ops.warm_up is None
    assert ops.paged_attention_decode is attention.paged_attention_decode
    assert ops.paged_attention_prefill is attention.paged_attention_prefill
    assert ops.reshape_and_cache is cache_ops.reshape_and_cache
    assert ops.copy_blocks is cache_ops.copy_blocks
    assert ops.swap_blocks is cache_ops.swap_blocks
    assert ops.rms_norm is layer_ops.rms_norm
    assert ops.add_rms_norm_ is layer_ops.add_rms_norm_
    assert ops.silu_and_mul is layer_ops.silu_and_mul
    assert ops.rotary_ is layer_ops.rotary_


def test_auto_on_cpu_compiles_where_a_compiler_exists(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setattr(dispatch.shutil, "which", lambda name: f"/usr/bin/{name}")
    ops = get_kernel_ops("cpu")
    assert ops.name == "cpu"
    assert ops.paged_attention_decode is cpu_attention.paged_attention_decode
    assert ops.paged_attention_prefill is cpu_attention.paged_attention_prefill
    assert ops.warm_up is dispatch._cpu_warm_up
    assert ops.rms_norm is cpu_layer_ops.rms_norm
    assert ops.add_rms_norm_ is cpu_layer_ops.add_rms_norm_
    assert ops.silu_and_mul is cpu_layer_ops.silu_and_mul
    assert ops.rotary_ is cpu_layer_ops.rotary_
    assert ops.reshape_and_cache is cpu_cache_ops.reshape_and_cache
    assert ops.linear_packing is not None
    monkeypatch.setattr(dispatch.shutil, "which", lambda name: None)
    assert get_kernel_ops("cpu") is TORCH_OPS


def test_inductor_keeps_the_compiled_attention():
    ops = get_kernel_ops("cpu", "inductor")
    assert ops.paged_attention_decode is compiled_attention.paged_attention_decode
    assert ops.paged_attention_prefill is compiled_attention.paged_attention_prefill
    assert ops.warm_up is compiled_attention.warm_up


@pytest.mark.parametrize("backend", ["inductor", "cpu"])
def test_cpu_backends_are_cpu_only(backend):
    with pytest.raises(ValueError) as info:
        get_kernel_ops("cuda", backend)
    assert str(info.value) == f"kernel backend {backend!r} runs on the CPU only, not on 'cuda'"


def test_torch_can_be_forced_on_cuda():
    assert get_kernel_ops("cuda", "torch").name == "torch"


def test_environment_is_only_the_default_of_backend_none(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert get_kernel_ops("cuda:0", None).name == "torch"
    monkeypatch.setenv(BACKEND_ENV, "triton")
    # An explicit backend, "auto" included, wins over the environment.
    assert get_kernel_ops("cpu", "auto").name != "triton"
    assert get_kernel_ops("cpu", "torch").name == "torch"


def test_unknown_backend_names_the_choices(monkeypatch):
    with pytest.raises(ValueError) as info:
        get_kernel_ops("cpu", "cutlass")
    assert str(info.value) == (
        "unknown kernel backend 'cutlass' (from backend); choose one of auto, torch, triton, "
        "inductor, cpu"
    )
    monkeypatch.setenv(BACKEND_ENV, "flash")
    with pytest.raises(ValueError) as info:
        get_kernel_ops("cpu", None)
    assert str(info.value) == (
        "unknown kernel backend 'flash' (from PAGEDSERVE_KERNEL_BACKEND); choose one of "
        "auto, torch, triton, inductor, cpu"
    )


def test_unimportable_triton_is_a_clear_error(monkeypatch):
    # A None entry in sys.modules makes the import fail exactly as a missing package does.
    monkeypatch.setitem(sys.modules, "pagedserve.kernels.triton", None)
    with pytest.raises(ImportError) as info:
        get_kernel_ops("cuda", "auto")
    assert str(info.value).startswith("kernel backend 'triton' is unavailable (")
    assert str(info.value).endswith(
        "); install triton (pip install 'pagedserve[gpu]') or choose backend 'torch'"
    )
    assert get_kernel_ops("cuda", "torch").name == "torch"


def test_kernel_ops_is_frozen():
    with pytest.raises(AttributeError):
        TORCH_OPS.name = "other"  # type: ignore[misc]
    assert isinstance(TORCH_OPS, KernelOps)
