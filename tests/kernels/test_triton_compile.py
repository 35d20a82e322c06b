"""The GPU build of every kernel, checked without a GPU: each kernel is compiled for sm_90
(Hopper) through Triton's bundled ptxas, in a child process free of TRITON_INTERPRET."""

from __future__ import annotations

import os
import subprocess
import sys


def test_every_kernel_compiles_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a cold cache: really compile
    result = subprocess.run(
        [sys.executable, "-m", "pagedserve.kernels.triton.compile_check", "--arch", "90",
         "--quick"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    compiled = {line.split()[2].split("(")[0] for line in lines if line.startswith("ok ")}
    assert compiled == {
        "_decode_kernel", "_decode_reduce_kernel", "_prefill_kernel",
        "_reshape_and_cache_kernel", "_copy_blocks_kernel",
    }
    assert lines[-1] == "compiled 6 kernels for sm_90, 0 over the limit"
