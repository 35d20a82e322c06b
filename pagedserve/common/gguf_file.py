"""Opening a GGUF file (llama.cpp's format) with the ``gguf`` package, once per process
(its reader, with metadata arrays read in one pass: ``gguf_reader.py``).

The model loader and the tokenizer loader both read the same file: the header (metadata and
the tensor table) is parsed once and shared until the engine has loaded both
(``forget_gguf_readers``), and the tensor data stays in the file's memory map until a loader
copies it out. A file that is not GGUF, is cut short or is malformed raises
``GGUFFileError`` naming the file.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
# The engine loads the tokenizer in a thread beside the model: the first to open a file parses
# its header, the other waits for it instead of parsing it a second time.
_READING = threading.Lock()


class GGUFFileError(ValueError):
    """The file cannot be read as GGUF, or lacks a key every model file has."""


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """A regular file named ``*.gguf`` or starting with the GGUF magic."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == GGUF_SUFFIX:
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """The ``gguf.GGUFReader`` of ``path`` (shared while the file is unchanged)."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError as exc:
        raise GGUFFileError(f"cannot open GGUF file {str(path)!r}: {exc.strerror}") from exc
    with _READING:
        return _read(path, stat.st_size, stat.st_mtime_ns)


def forget_gguf_readers() -> None:
    """Drops the shared readers once the loaders are done: a parsed header holds the
    vocabulary's strings and the tensor table as Python objects, 20 MiB for a 49,152-token
    vocabulary, which a serving process does not read again (a later ``open_gguf`` parses
    the header anew, in about 0.1 s)."""
    _read.cache_clear()


@lru_cache(maxsize=2)
def _read(path: Path, size: int, mtime_ns: int) -> Any:
    # numpy-heavy; only GGUF users pay for the import
    from pagedserve.common.gguf_reader import FastArrayReader

    try:
        return FastArrayReader(path, "r")
    except (ValueError, KeyError, IndexError, TypeError, OSError, OverflowError) as exc:
        # The reader walks the header with numpy views: a file cut short shows up as a view
        # that is too small to reshape or index.
        raise GGUFFileError(
            f"{str(path)!r} is not a readable GGUF file ({size} bytes): {exc}"
        ) from exc


def release_gguf_files() -> None:
    """Drops the shared headers once the loaders are done: the tokenizer's metadata alone is
    hundreds of thousands of small objects, and the memory map is not needed after loading."""
    _read.cache_clear()


def metadata_value(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value as Python (str, int, float, bool or list), or ``default``."""
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise GGUFFileError(f"GGUF metadata {key!r} is malformed: {exc}") from exc


def required_value(reader: Any, key: str) -> Any:
    value = metadata_value(reader, key)
    if value is None:
        raise GGUFFileError(f"GGUF file {str(reader.data.filename)!r} has no {key!r} metadata")
    return value
