"""Tiny GGUF files for tests, written with ``gguf.GGUFWriter`` as llama.cpp's converter would.

API:
- ``write_gguf(path, checkpoint, *, qtype="F32", tokenizer="gpt2", random_blocks=False,
  metadata=None, skip=(), reshape=None) -> Path`` converts a ``tests/checkpoints.py``
  checkpoint: tensor names through ``gguf``'s own name map, a Llama model's Q/K rows (weights
  and biases) permuted for llama.cpp's rope, 2-D weights quantized to ``qtype``
  (``gguf.quants.quantize``) or, with
  ``random_blocks``, filled with random blocks of ``qtype`` (for types ``gguf`` cannot quantize
  to, such as Q4_K); ``tokenizer`` is ``"gpt2"`` (a byte-level BPE with merges and ChatML
  tokens), ``"spm"`` (a SentencePiece vocabulary with scores and byte tokens) or None.
  ``metadata`` overrides keys (a None value drops the key), ``skip`` leaves tensors out and
  ``reshape`` maps a GGUF tensor name to the shape it is written with, ``dtypes`` to a numpy
  dtype it is written in unquantized (``np.float64`` gives an F64 tensor), ``qtypes`` to the
  type it is written in instead of ``qtype`` (random blocks where ``gguf`` cannot quantize to
  it: a llama.cpp-style mix such as Q4_K_M).
- ``truncate(path, keep)`` cuts a file to its first ``keep`` bytes.
- ``set_number(path, key, value)`` rewrites a numeric metadata value in place (as ``gguf``'s
  ``gguf_set_metadata`` does), e.g. to make a file's metadata disagree with its tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tests.gguf_blocks import SCALE_OFFSETS, random_blocks

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_ARCHES = {"llama": "LLAMA", "qwen2": "QWEN2"}
# The word pieces of the toy vocabularies, in merge order.
_BPE_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n"), ("e", "r"),
               ("o", "n"), ("Ġ", "s"), ("r", "e"), ("a", "t"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")]
_SPM_PIECES = ["▁t", "he", "▁the", "▁a", "in", "er", "on", "▁s", "re", "at", "▁▁", "▁▁▁▁",
               "▁c", "▁ca", "at", "▁cat", "is", "▁is"]


def _forward_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter: each head's two rotary halves become interleaved pairs.
    rows = weights.shape[0]
    return (weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def _gpt2_vocab(size: int) -> dict[str, Any]:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_tokens()]
    types = [3, 3, 3] + [1] * 256
    for left, right in _BPE_MERGES:
        tokens.append(left + right)
        types.append(1)
    tokens.append("<think>")
    types.append(4)
    tokens += [f"[PAD{i}]" for i in range(size - len(tokens))]
    types += [5] * (size - len(types))
    return {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "token_type": types,
            "merges": [f"{a} {b}" for a, b in _BPE_MERGES], "bos_token_id": 1,
            "eos_token_id": 2, "padding_token_id": 0, "add_bos_token": False}


def _spm_vocab(size: int) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz.,!?'", *dict.fromkeys(_SPM_PIECES)]
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))
    tokens += [f"[PAD{i}]" for i in range(size - len(tokens))]
    types += [5] * (size - len(types))
    scores += [-1e9] * (size - len(scores))
    return {"model": "llama", "tokens": tokens, "token_type": types, "scores": scores,
            "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}


def _add_tokenizer(writer: Any, kind: str, vocab_size: int) -> None:
    vocab = _gpt2_vocab(vocab_size) if kind == "gpt2" else _spm_vocab(vocab_size)
    writer.add_tokenizer_model(vocab["model"])
    if "pre" in vocab:
        writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_type"])
    if "merges" in vocab:
        writer.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        writer.add_token_scores(vocab["scores"])
    writer.add_bos_token_id(vocab["bos_token_id"])
    writer.add_eos_token_id(vocab["eos_token_id"])
    if "padding_token_id" in vocab:
        writer.add_pad_token_id(vocab["padding_token_id"])
    if "unknown_token_id" in vocab:
        writer.add_unk_token_id(vocab["unknown_token_id"])
    if "add_bos_token" in vocab:
        writer.add_add_bos_token(vocab["add_bos_token"])
    writer.add_chat_template(CHATML)


def _random_blocks(shape: tuple[int, ...], qtype: Any, seed: int) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import quant_shape_to_byte_shape

    if qtype.name in SCALE_OFFSETS and len(shape) == 2:
        return random_blocks(qtype, shape[0], shape[1], seed, scale=(0.0001, 0.0004))

    _, size = GGML_QUANT_SIZES[qtype]
    rows = np.random.default_rng(seed).integers(0, 256, quant_shape_to_byte_shape(shape, qtype),
                                                dtype=np.uint8)
    # Every block starts with its float16 scale (and a float16 minimum for the *_K/_1 types):
    # small finite values keep the weights in a sane range.
    blocks = rows.reshape(-1, size)
    scales = np.random.default_rng(seed + 1).uniform(0.0001, 0.0004, (blocks.shape[0], 2))
    blocks[:, :4] = scales.astype(np.float16).view(np.uint8)
    return rows


def _metadata(writer: Any, config: Mapping[str, Any], qtype: Any) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config.get("rope_theta") or 10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(0 if qtype.name == "F32" else 7)


def write_gguf(
    path: str | Path, checkpoint: str | Path, *, qtype: str = "F32",
    tokenizer: str | None = "gpt2", random_blocks: bool = False,
    metadata: Mapping[str, Any] | None = None, skip: Iterable[str] = (),
    reshape: Mapping[str, tuple[int, ...]] | None = None,
    dtypes: Mapping[str, Any] | None = None,
    qtypes: Mapping[str, str] | None = None,
) -> Path:
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    family = config["model_type"]
    arch = getattr(gguf.MODEL_ARCH, _ARCHES[family])
    quant = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _metadata(writer, config, quant)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer, config["vocab_size"])
    for key, value in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)
        if value is not None:
            kind = gguf.GGUFValueType.get_type(value)
            writer.add_key_value(key, value, kind)
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    skipped, reshaped = set(skip), dict(reshape or {})
    for seed, (name, array) in enumerate(sorted(load_file(Path(checkpoint) /
                                                          "model.safetensors").items())):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None or gguf_name in skipped:
            continue
        array = array.astype(np.float32)
        part = name.split(".")[-2]
        if family == "llama" and part in heads:
            array = _forward_permute(array, heads[part])
        if gguf_name in reshaped:
            array = np.resize(array, reshaped[gguf_name])
        if gguf_name in (dtypes or {}):
            writer.add_tensor(gguf_name, array.astype(dtypes[gguf_name]))
        elif gguf_name in (qtypes or {}) and array.ndim == 2:
            kind = gguf.GGMLQuantizationType[qtypes[gguf_name]]
            try:
                data = gguf.quants.quantize(array, kind)
            except NotImplementedError:
                data = _random_blocks(array.shape, kind, seed)
            writer.add_tensor(gguf_name, data, raw_dtype=kind)
        elif array.ndim < 2 or quant == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array))
        elif random_blocks:
            writer.add_tensor(gguf_name, _random_blocks(array.shape, quant, seed), raw_dtype=quant)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, quant), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def truncate(path: str | Path, keep: int) -> Path:
    data = Path(path).read_bytes()[:keep]
    Path(path).write_bytes(data)
    return Path(path)


def set_number(path: str | Path, key: str, value: int | float) -> Path:
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    field = reader.fields[key]
    field.parts[field.data[0]][0] = value
    reader.data.flush()
    return Path(path)
