"""Building and loading the C kernels in ``kernels/csrc`` for this machine.

Each source is compiled once per machine (``-O3 -march=native``, so the host's vector units
are used; a source that picks its vector path at run time is built for the x86-64-v2 baseline
instead, its paths carrying their own target attributes) into
``$PAGEDSERVE_CACHE_DIR/kernels``, keyed by a hash of the source and headers,
the flags, the compiler and the processor, and loaded with ``ctypes``. A build is written
under a temporary name and renamed, so concurrent processes (tensor-parallel ranks, test
workers) never load a partial file. No Python headers and no torch headers are needed: the
kernels take raw pointers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from pagedserve.common.cache_dir import default_cache_dir

SOURCE_DIR = Path(__file__).with_name("csrc")
# Reassociation lets the compiler vectorise the dot products; no -ffast-math, which may flush
# denormals for the whole process. -fopenmp links libgomp.so.1, which the loader resolves to
# the copy torch has already loaded: the kernels run on torch's threads (cpu_parallel.py).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-fopenmp", "-fPIC", "-shared")
# Sources that choose their vector paths at run time (each path a function with its own target
# attributes) are built for the x86-64 baseline on x86, so that a path that is not chosen never
# leaks into the others: the AVX2 path stays AVX2 on an AVX-512 machine.
RUNTIME_DISPATCH = frozenset({"block_quant"})
X86_BASELINE = ("-march=x86-64-v2", "-mtune=native")


class NativeBuildError(RuntimeError):
    """The C compiler is missing or failed; the message carries its output."""


def c_compiler() -> str | None:
    """$CC, else the first of cc / gcc / clang on the PATH."""
    return _find_compiler(os.environ.get("CC", ""), os.environ.get("PATH"))


@functools.cache
def _find_compiler(cc: str, path: str | None) -> str | None:
    """Looked up once per $CC and $PATH (``path``, the key: ``which`` reads it itself):
    every library's load asks, and each look walks the PATH."""
    names = [cc] if cc else ["cc", "gcc", "clang"]
    return next((found for name in names if (found := shutil.which(name))), None)


@functools.cache
def _host() -> bytes:
    """The processor the build is for: -march=native code may not run on another one (a cache
    directory on a shared disk or in a moved container)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    ident = [line for line in lines if line.startswith(("model name", "flags", "Features"))][:2]
    return "\n".join([platform.machine(), platform.processor(), *ident]).encode()


def _flags(name: str) -> tuple[str, ...]:
    if name in RUNTIME_DISPATCH and platform.machine().lower() in ("x86_64", "amd64"):
        return tuple(f for f in FLAGS if f != "-march=native") + X86_BASELINE
    return FLAGS


def _build_key(source: bytes, compiler: str, flags: tuple[str, ...]) -> str:
    """A hash of the source, the headers it may include, the flags, the compiler and the
    processor."""
    version = _compiler_version(compiler)
    headers = b"".join(path.read_bytes() for path in sorted(SOURCE_DIR.glob("*.h")))
    digest = hashlib.sha256(source + headers + " ".join(flags).encode() + version.encode()
                            + _host())
    return digest.hexdigest()[:16]


@functools.cache
def _compiler_version(compiler: str) -> str:
    """Asked once a process: each library's key needs it, and a run of the compiler costs
    about 0.1 s of start-up."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True,
                          check=False).stdout


@functools.cache
def load_library(name: str) -> ctypes.CDLL:
    """``csrc/NAME.c`` built for this machine and loaded (built on first use)."""
    compiler = c_compiler()
    if compiler is None:
        raise NativeBuildError("no C compiler found (set $CC or install gcc)")
    source_path = SOURCE_DIR / f"{name}.c"
    source = source_path.read_bytes()
    out_dir = default_cache_dir() / "kernels"
    flags = _flags(name)
    target = out_dir / f"{name}-{_build_key(source, compiler, flags)}.so"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = Path(tmp) / target.name
            result = subprocess.run([compiler, *flags, "-o", str(partial), str(source_path)],
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise NativeBuildError(f"compiling {source_path.name} with {compiler} failed:\n"
                                       f"{result.stderr.strip()}")
            os.replace(partial, target)
    return ctypes.CDLL(str(target))
