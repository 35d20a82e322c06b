"""Without CUDA the Triton kernels run under Triton's interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when ``pagedserve.kernels.triton``
is first imported, so the variable is set here, at the collection of this folder, before any
test module imports the package. Importing torch or triton earlier is harmless.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    _decode = sys.modules.get("pagedserve.kernels.triton.decode")
    if _decode is not None:
        from pagedserve.kernels.triton.runtime import is_interpreted

        if not is_interpreted(_decode._decode_kernel):
            raise RuntimeError(
                "pagedserve.kernels.triton was imported for CUDA before tests/kernels was "
                "collected, on a machine without CUDA; set TRITON_INTERPRET=1 for the run"
            )
