"""The GGUF reader the loaders share reads every metadata value, array or not, and every
tensor exactly as the ``gguf`` package's own reader does, and refuses a file cut inside an
array."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from pagedserve.common.gguf_file import GGUFFileError, open_gguf, release_gguf_files
from pagedserve.common.gguf_reader import FastArrayReader


def _write(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.chat_template", "{{ messages }} é ✓")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "é", "", "Ġthe", "日本"] * 40)
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0])
    writer.add_array("tokenizer.ggml.token_type", [1, 3, 4, 6])
    writer.add_array("some.flags", [True, False, True])
    writer.add_array("some.empty", [])
    writer.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b.weight", np.ones((2, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_every_field_and_tensor_reads_as_the_packages_reader_reads_it(tmp_path):
    path = _write(tmp_path / "m.gguf")
    ours, theirs = FastArrayReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert mine.contents() == field.contents(), key
        assert list(mine.types) == list(field.types), key
        assert len(mine.data) == len(field.data), key
    tokens = ours.fields["tokenizer.ggml.tokens"]
    assert tokens.contents(1) == "é" and tokens.contents(slice(3, 5)) == ["Ġthe", "日本"]
    assert ours.fields["some.flags"].contents() == [True, False, True]
    for mine, theirs_tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.tensor_type, mine.n_bytes) == (
            theirs_tensor.name, theirs_tensor.tensor_type, theirs_tensor.n_bytes)
        assert np.array_equal(mine.data, theirs_tensor.data)


@pytest.mark.parametrize("keep", [150, 400, 1500])
def test_a_file_cut_inside_its_metadata_is_refused(tmp_path, keep):
    path = _write(tmp_path / "m.gguf")
    path.write_bytes(path.read_bytes()[:keep])
    release_gguf_files()
    with pytest.raises(GGUFFileError, match="is not a readable GGUF file"):
        open_gguf(path)
