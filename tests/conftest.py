"""Suite-wide kernel backend: the uncompiled torch reference unless $PAGEDSERVE_KERNEL_BACKEND
says otherwise.

The CPU default (``auto``) compiles each model's decode attention with inductor, seconds per
head layout, and the suite loads dozens of differently shaped models. The paths that must run
the default, compiled path opt back in: tests/e2e (parity with transformers) and
tests/kernels/test_compiled_attention.py (which calls the kernels directly).

On CUDA an engine sizes its KV cache by default from gpu_memory_utilization (90% of the GPU,
vLLM's meaning), and refuses to start when that much is not free. A test process holds several
engines at once (a module's engine beside a test's own), so in the suite each engine not sized
by its test gets the CPU's default 1 GiB instead.

The CPU KV cache is not prefaulted either ($PAGEDSERVE_KV_CACHE_PREFAULT=0): a test process
holds many engines of 1 GiB default caches at once, and writing each whole would commit all
of that memory. tests/engine/test_kv_cache_prefault.py and the start-up log test turn it on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import torch

from pagedserve.kernels.dispatch import BACKEND_ENV
from pagedserve.server.engine.config.engine_args import PREFAULT_ENV, EngineArgs
from pagedserve.server.engine.config.engine_config import DEFAULT_KV_CACHE_MEMORY, CacheConfig


def _unless_set(name: str, value: str) -> Iterator[None]:
    """Sets ``$name`` to ``value`` for the session unless the caller set it."""
    if name in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(name, value)
        yield


@pytest.fixture(scope="session", autouse=True)
def reference_kernels_by_default() -> Iterator[None]:
    yield from _unless_set(BACKEND_ENV, "torch")


@pytest.fixture(scope="session", autouse=True)
def lazy_kv_caches() -> Iterator[None]:
    yield from _unless_set(PREFAULT_ENV, "0")


def fixed_kv_cache_size(original: Callable[[EngineArgs], CacheConfig]
                        ) -> Callable[[EngineArgs], CacheConfig]:
    """``EngineArgs.cache_config`` with 1 GiB of KV where the arguments name no size."""
    def cache_config(args: EngineArgs, device_type: str = "cpu") -> CacheConfig:
        config = original(args, device_type)
        if config.sized_by_memory_default:
            config = replace(config, kv_cache_memory=DEFAULT_KV_CACHE_MEMORY)
        return config
    return cache_config


@pytest.fixture(scope="session", autouse=True)
def one_gib_kv_caches_on_cuda() -> Iterator[None]:
    if not torch.cuda.is_available():
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineArgs, "cache_config", fixed_kv_cache_size(EngineArgs.cache_config))
        yield
