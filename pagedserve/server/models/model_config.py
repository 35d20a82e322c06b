"""``ModelConfig``: what the engine needs from a Hugging Face ``config.json``.

Both spellings that transformers has written are read: ``torch_dtype`` / ``dtype``, and
``rope_theta`` + ``rope_scaling`` / ``rope_parameters`` (transformers 5).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pagedserve.server.models.model_load_error import ModelLoadError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}
ROPE_TYPES = ("default", "linear", "llama3", "longrope")
# Phi-3's first 128k checkpoints named LongRoPE "su".
_ROPE_ALIASES = {"su": "longrope"}
# PretrainedConfig ties embeddings unless a family's config class says otherwise; OPT keeps the
# base default, the Llama-style families set False.
_TIED_BY_DEFAULT = frozenset({"opt"})


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float32`` from ``"float32"`` (or ``"fp32"``, ``"bf16"``, ...); a dtype passes."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise ModelLoadError(
        f"unsupported dtype {dtype!r}; choose one of float32, bfloat16, float16"
    )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model's shape and numerics. ``hf_config`` keeps the raw config.json for the
    family-specific keys a model file reads (OPT's ``do_layer_norm_before``, ...)."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    norm_eps: float = 1e-5
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    note: str | None = None
    hf_config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"config {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def max_model_len(self) -> int:
        """The longest sequence this engine computes exactly: sliding-window attention is not
        implemented, so a windowed model stops at its window; LongRoPE runs its short factors
        only, so such a model stops at its original context."""
        limit = self.max_position_embeddings
        if self.sliding_window is not None:
            limit = min(limit, self.sliding_window)
        if self.rope_scaling is not None and self.rope_scaling["rope_type"] == "longrope":
            limit = min(limit, int(self.rope_scaling["original_max_position_embeddings"]))
        return limit

    def bytes_per_block(self, block_size: int, dtype: str | torch.dtype) -> int:
        """Bytes of K and V, all layers, for one block of ``block_size`` tokens."""
        itemsize = torch.empty((), dtype=parse_dtype(dtype)).element_size()
        per_token = 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim
        return per_token * block_size * itemsize

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        """Reads ``model_dir/config.json`` (and eos ids from ``generation_config.json``)."""
        model_dir = Path(model_dir)
        raw = _read_json(model_dir / "config.json", required=True)
        generation = _read_json(model_dir / "generation_config.json", required=False)
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        architectures = raw.get("architectures") or []
        if not architectures:
            raise ModelLoadError("config.json has no 'architectures' entry")
        model_type = str(raw.get("model_type", ""))
        heads = raw.get("num_attention_heads")
        hidden = raw.get("hidden_size")
        theta, scaling = _rope(raw)
        return cls(
            architecture=architectures[0],
            model_type=model_type,
            vocab_size=raw.get("vocab_size"),
            hidden_size=hidden,
            intermediate_size=raw.get("intermediate_size", raw.get("ffn_dim")),
            num_hidden_layers=raw.get("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or _divide(hidden, heads),
            max_position_embeddings=raw.get("max_position_embeddings"),
            rope_theta=theta,
            rope_scaling=scaling,
            norm_eps=float(raw.get("rms_norm_eps", raw.get("layer_norm_eps", 1e-5))),
            hidden_act=raw.get("hidden_act", raw.get("activation_function", "silu")),
            tie_word_embeddings=bool(
                raw.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
            ),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_ids(raw, generation or {}),
            sliding_window=_sliding_window(raw),
            note=raw.get("pagedserve_note"),
            hf_config=dict(raw),
        )


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"no config.json in {path.parent}")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _divide(hidden: Any, heads: Any) -> Any:
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None  # __post_init__ reports the bad field by name


def _rope(raw: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    theta = float(raw.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    partial = float(raw.get("partial_rotary_factor") or params.pop("partial_rotary_factor", None)
                    or 1.0)
    params.pop("partial_rotary_factor", None)
    if partial != 1.0:
        raise ModelLoadError(
            f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported; "
            f"supported: rotary embeddings over the whole head"
        )
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    rope_type = _ROPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(
            f"unsupported rope_scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        params = _longrope(raw, params)
    return theta, {"rope_type": rope_type, **params}


def _longrope(raw: Mapping[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """LongRoPE's parameters with its cos/sin scale filled in as transformers computes it
    (from the ratio of the context lengths when no ``factor`` is given)."""
    original = params.get("original_max_position_embeddings",
                          raw.get("original_max_position_embeddings"))
    if not original or "short_factor" not in params:
        raise ModelLoadError("rope_scaling of type 'longrope' needs 'short_factor' and "
                             "'original_max_position_embeddings'")
    params["original_max_position_embeddings"] = int(original)
    if params.get("attention_factor") is None:
        factor = params.get("factor") or (raw.get("max_position_embeddings") or 0) / original
        params["attention_factor"] = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original)))
    return params


def _token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def _eos_ids(raw: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    # Chat checkpoints often list their end-of-turn token only in generation_config.json.
    ids = _token_ids(raw.get("eos_token_id")) + _token_ids(generation.get("eos_token_id"))
    return tuple(dict.fromkeys(ids))


def _sliding_window(raw: Mapping[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if not window or raw.get("use_sliding_window") is False:
        return None
    return int(window)
