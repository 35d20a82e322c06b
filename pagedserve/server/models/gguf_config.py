"""``ModelConfig`` from a GGUF file's metadata (llama.cpp's ``{arch}.*`` keys).

The metadata is translated into the config.json keys transformers would write, so the one
``ModelConfig.from_dict`` builds both sources' configs: a GGUF model and its Hugging Face
checkpoint get equal configs. The embedding is tied to the output when the file has no
``output.weight`` (llama.cpp's converter drops the copy). Rope scaling that llama.cpp stores as
tensors (Llama 3.1's ``rope_freqs``, LongRoPE's short and long factors) is read into the config
too; the rotary share of each head (``rope.dimension_count``) becomes
``partial_rotary_factor``, refused unless it is 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedserve.common.gguf_file import GGUFFileError, metadata_value, required_value
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError

# general.architecture → (the Hugging Face architecture, its model_type)
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
OUTPUT_TENSOR = "output.weight"
EMBEDDING_TENSOR = "token_embd.weight"
# llama.cpp ships rope scaling that is not a formula as per-frequency divisors in tensors:
# Llama 3.1's in one, LongRoPE's (Phi-3) in two, one per context range.
ROPE_FACTORS_TENSOR = "rope_freqs.weight"
LONGROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")
ROPE_TENSORS = frozenset({ROPE_FACTORS_TENSOR, *LONGROPE_TENSORS})
# general.file_type → the checkpoint dtype the weights were converted from; quantized files
# dequantize to bfloat16 on accelerators (float16 where bfloat16 is missing).
_FILE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def gguf_architecture(reader: Any) -> str:
    """The file's ``general.architecture``, refused unless a model family serves it."""
    arch = required_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    return arch


def gguf_config_dict(reader: Any) -> dict[str, Any]:
    """The config.json keys the metadata stands for."""
    arch = gguf_architecture(reader)
    architecture, model_type = GGUF_ARCHITECTURES[arch]
    tensor_names = {t.name for t in reader.tensors}

    def get(key: str, default: Any = None) -> Any:
        return metadata_value(reader, f"{arch}.{key}", default)

    def need(key: str) -> Any:
        return required_value(reader, f"{arch}.{key}")

    heads = need("attention.head_count")
    hidden = need("embedding_length")
    raw: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": _embedding_rows(reader) or get("vocab_size") or _vocab_size(reader),
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "max_position_embeddings": need("context_length"),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, get),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "hidden_act": "silu",
        "tie_word_embeddings": OUTPUT_TENSOR not in tensor_names,
        # Llama-layout checkpoints may carry projection biases; the file shows which.
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in tensor_names,
        "torch_dtype": _FILE_DTYPES.get(metadata_value(reader, "general.file_type"), "bfloat16"),
        "bos_token_id": metadata_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(reader),
    }
    _check_vocabulary(reader, raw["vocab_size"])
    key_length = get("attention.key_length")
    if key_length is not None:
        raw["head_dim"] = key_length
    # phi3 files write 0 for "no window".
    raw["sliding_window"] = get("attention.sliding_window") or None
    raw["partial_rotary_factor"] = _rotary_fraction(get, key_length, hidden, heads)
    return raw


def gguf_model_config(reader: Any) -> ModelConfig:
    """The ``ModelConfig`` of an open GGUF file."""
    try:
        return ModelConfig.from_dict(gguf_config_dict(reader))
    except GGUFFileError as exc:
        raise ModelLoadError(str(exc)) from exc


def _embedding_rows(reader: Any) -> int | None:
    for tensor in reader.tensors:
        if tensor.name == EMBEDDING_TENSOR and len(tensor.shape) == 2:
            return int(tensor.shape[-1])  # GGUF lists dimensions innermost first
    return None


def _vocab_size(reader: Any) -> int | None:
    # Older files leave {arch}.vocab_size out; the tokenizer's list has one entry per row.
    field = reader.fields.get("tokenizer.ggml.tokens")
    return len(field.data) if field is not None else None


def _check_vocabulary(reader: Any, vocab_size: Any) -> None:
    # Embedding rows without a token are fine (padding); a token without a row is not.
    tokens = _vocab_size(reader)
    if tokens is not None and isinstance(vocab_size, int) and tokens > vocab_size:
        raise ModelLoadError(
            f"GGUF vocabulary has {tokens} tokens but the model has {vocab_size} embedding "
            f"rows; the file's tokenizer and weights disagree"
        )


def _rotary_fraction(get: Any, key_length: Any, hidden: Any, heads: Any) -> float:
    """The share of each head that is rotated (``rope.dimension_count`` over the head size)."""
    head_dim = key_length or (hidden // heads if isinstance(hidden, int) and heads else None)
    rotated = get("rope.dimension_count")
    if not rotated or not head_dim:
        return 1.0
    return rotated / head_dim


def _factor_tensor(reader: Any, name: str) -> list[float] | None:
    for tensor in reader.tensors:
        if tensor.name == name:
            return [float(x) for x in np.asarray(tensor.data, dtype=np.float32).reshape(-1)]
    return None


def _rope_scaling(reader: Any, get: Any) -> dict[str, Any] | None:
    frequency_factors = _factor_tensor(reader, ROPE_FACTORS_TENSOR)
    if frequency_factors is not None:
        return {"rope_type": "llama3", "frequency_factors": frequency_factors}
    short, long = (_factor_tensor(reader, name) for name in LONGROPE_TENSORS)
    if short is not None:
        return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                "original_max_position_embeddings": get("rope.scaling.original_context_length"),
                "attention_factor": get("rope.scaling.attn_factor")}
    kind = get("rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = get("rope.scaling.factor")
    if kind != "linear" or not factor:
        raise ModelLoadError(
            f"GGUF rope scaling {kind!r} (factor {factor!r}) is not supported; supported: "
            f"linear with a factor"
        )
    return {"rope_type": "linear", "factor": float(factor)}


def _eos_ids(reader: Any) -> list[int]:
    # llama.cpp ends a turn on the end-of-turn token as well as on EOS.
    ids = [metadata_value(reader, f"tokenizer.ggml.{key}")
           for key in ("eos_token_id", "eot_token_id")]
    return list(dict.fromkeys(i for i in ids if i is not None))
