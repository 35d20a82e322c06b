"""``gguf.GGUFReader`` with its metadata arrays read in one pass each.

The ``gguf`` package's reader walks an array value element by element, building two numpy
views (length and bytes) per string through the memory map: for a 49,152-token vocabulary
(tokens, scores, types, merges) that is hundreds of thousands of views and about five seconds
of a server's start-up. Here an array of numbers is one ``frombuffer`` and an array of strings
one loop over its length prefixes; everything else (scalars, the tensor table, tensor data)
is the package's own code. An array field answers ``contents()`` (whole, an index or a slice),
``data`` (one entry per element) and ``types`` as the package's ``ReaderField`` does; its
``parts`` hold only its header. Files of the other byte order, and nested arrays, take the
package's path.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderField

_LENGTH = struct.Struct("<Q")
_ARRAY_HEADER = struct.Struct("<IQ")  # element type, element count


class ArrayField(ReaderField):
    """One metadata array, its values decoded once: the last part holds them all (numbers in
    their numpy type, strings as Python objects) and ``data`` has one entry per element."""

    __slots__ = ()

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        value = self.parts[-1][index_or_slice]
        return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


class FastArrayReader(GGUFReader):
    def _build_fields(self, offs: int, count: int) -> int:
        if self.byte_order != "I":  # a file of the other byte order: the package's way
            return super()._build_fields(offs, count)
        buffer = self.data.data  # a memoryview of the map
        for _ in range(count):
            start = offs
            key_length, key = self._get_str(offs)
            offs += int(key_length.nbytes + key.nbytes)
            raw_type = self._get(offs, np.uint32)
            offs += int(raw_type.nbytes)
            array = (self._array(buffer, start, str(bytes(key), encoding="utf-8"), offs)
                     if raw_type[0] == GGUFValueType.ARRAY else None)
            if array is not None:
                field, size = array
                self._push_field(field, skip_sum=True)
                offs += size
                continue
            head: list[Any] = [key_length, key, raw_type]
            size, parts, indices, types = self._get_field_parts(offs, raw_type[0])
            self._push_field(ReaderField(start, str(bytes(key), encoding="utf-8"), head + parts,
                                         [i + len(head) for i in indices], types),
                             skip_sum=True)
            offs += size
        return offs

    def _array(self, buffer: memoryview, start: int, name: str,
               offs: int) -> tuple[ArrayField, int] | None:
        """The array at ``offs`` and its size in bytes, or None for a nested array."""
        if offs + _ARRAY_HEADER.size > len(buffer):
            raise ValueError(f"metadata array {name!r} runs past the end of the file")
        raw_element, length = _ARRAY_HEADER.unpack_from(buffer, offs)
        element = GGUFValueType(raw_element)
        begin = offs + _ARRAY_HEADER.size
        values: np.ndarray
        if element == GGUFValueType.STRING:
            strings, end = _strings(buffer, begin, length)
            values = np.empty(length, dtype=object)
            values[:] = strings
        elif element in self.gguf_scalar_to_np:
            dtype = np.dtype(self.gguf_scalar_to_np[element])
            end = begin + dtype.itemsize * length
            if end > len(buffer):
                raise ValueError(f"metadata array {name!r} runs past the end of the file")
            values = np.frombuffer(buffer, dtype, length, begin)
        else:
            return None
        parts = [self._get(offs, np.uint32), self._get(offs + 4, np.uint64), values]
        field = ArrayField(start, name, parts, list(range(length)),
                           [GGUFValueType.ARRAY, element])
        return field, end - offs


def _strings(buffer: memoryview, offs: int, count: int) -> tuple[list[str], int]:
    values = []
    for _ in range(count):
        if offs + _LENGTH.size > len(buffer):
            raise ValueError("a metadata string runs past the end of the file")
        (length,) = _LENGTH.unpack_from(buffer, offs)
        offs += _LENGTH.size
        if offs + length > len(buffer):
            raise ValueError("a metadata string runs past the end of the file")
        values.append(str(buffer[offs : offs + length], encoding="utf-8"))
        offs += length
    return values, offs
