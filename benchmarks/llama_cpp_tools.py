"""llama.cpp's own tools, as users make GGUF files with them: the converter
(``convert_hf_to_gguf.py``) and the quantizer (``llama-quantize``), from the tree that
``../shared/peers/install-llama-cpp.sh`` builds (``~/.cache/pagedserve-peers/llama.cpp`` by
default, or $LLAMA_CPP_DIR). The converter runs with the interpreter running this code; it
imports torch, transformers and sentencepiece (its own requirements).

Used by ``benchmarks/gguf_presets.py`` and ``tests/fixtures/make_gguf_fixtures.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "pagedserve-peers" / "llama.cpp"
# llama-quantize's presets that need no importance matrix, in the order users meet them.
PRESETS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
           "Q6_K", "IQ4_NL", "IQ4_XS")


class ToolError(RuntimeError):
    """A llama.cpp tool is missing or failed; the message holds its output's tail."""


@dataclass(frozen=True, slots=True)
class LlamaCpp:
    """A built llama.cpp tree: ``src/`` with the converter and ``src/build/bin``."""

    root: Path

    @classmethod
    def find(cls, given: str | os.PathLike[str] | None = None) -> LlamaCpp:
        root = Path(given or os.environ.get("LLAMA_CPP_DIR") or DEFAULT_DIR)
        tools = cls(root)
        for path in (tools.converter, tools.binary("llama-quantize")):
            if not path.is_file():
                raise ToolError(f"{path} is missing; build llama.cpp with "
                                f"../shared/peers/install-llama-cpp.sh")
        return tools

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def converter(self) -> Path:
        return self.src / "convert_hf_to_gguf.py"

    def binary(self, name: str) -> Path:
        return self.src / "build" / "bin" / name

    def version(self) -> str:
        """llama-server's version line (the tree carries no git metadata)."""
        out = _run([str(self.binary("llama-server")), "--version"], check=False)
        lines = [line for line in out.splitlines() if line.startswith("version:")]
        return lines[0] if lines else "unknown"

    def convert(self, checkpoint: Path, outfile: Path, outtype: str) -> Path:
        """``convert_hf_to_gguf.py checkpoint --outtype outtype --outfile outfile``."""
        env = {**os.environ, "PYTHONPATH": str(self.src / "gguf-py")}
        _run([sys.executable, str(self.converter), str(checkpoint), "--outtype", outtype,
              "--outfile", str(outfile)], env=env)
        return outfile

    def quantize(self, source: Path, outfile: Path, preset: str, threads: int = 1) -> str:
        """``llama-quantize source outfile preset``; returns its log (per-tensor types)."""
        return _run([str(self.binary("llama-quantize")), str(source), str(outfile), preset,
                     str(threads)])


def _run(command: list[str], env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    if check and done.returncode != 0:
        raise ToolError(f"{' '.join(command)} exited {done.returncode}:\n{output[-3000:]}")
    return output
