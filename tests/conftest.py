"""Suite-wide kernel backend: the uncompiled torch reference unless $PAGEDSERVE_KERNEL_BACKEND
says otherwise.

The CPU default (``auto``) compiles each model's decode attention with inductor, seconds per
head layout, and the suite loads dozens of differently shaped models. The paths that must run
the default, compiled path opt back in: tests/e2e (parity with transformers) and
tests/kernels/test_compiled_attention.py (which calls the kernels directly).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from pagedserve.kernels.dispatch import BACKEND_ENV


@pytest.fixture(scope="session", autouse=True)
def reference_kernels_by_default() -> Iterator[None]:
    if BACKEND_ENV in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BACKEND_ENV, "torch")
        yield
