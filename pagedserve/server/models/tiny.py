"""The embedded ``tiny`` model: a Llama-architecture checkpoint with seeded random weights and
the ``cl100k_base`` vocabulary, written on first use so the whole stack runs without a download.

Its text is gibberish: config.json says so in ``pagedserve_note`` and the loader warns. Written
without transformers: config.json, generation_config.json and model.safetensors by hand, plus
``tiktoken.json`` naming the encoding for the tokenizer loader.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pagedserve.common.cache_dir import default_cache_dir
from pagedserve.common.encoding import load_encoding

TINY_NAME = "tiny"
ENCODING = "cl100k_base"
EOS_TOKEN = "<|endoftext|>"
SEED = 0
INIT_STD = 0.02
# Bump when the recipe changes, so an old cached copy is never mistaken for the new one.
TINY_DIR_NAME = "tiny-llama-cl100k-v1"
SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}
NOTE = (
    "random weights (seeded): the embedded tiny model exercises the serving stack and "
    "produces gibberish; point --model at a real checkpoint for meaningful text"
)


def tiny_config() -> dict[str, Any]:
    encoding = load_encoding(ENCODING)
    eos = encoding.encode_single_token(EOS_TOKEN)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": encoding.n_vocab,
        **SHAPE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
        "torch_dtype": "bfloat16",
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pagedserve_note": NOTE,
        "pagedserve_seed": SEED,
    }


def tiny_weights(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Checkpoint tensors by Hugging Face name: N(0, 0.02) matrices, unit norm gains. With the
    embedding tied to the output, 0.02 keeps logits spread (std ~ 0.2) but not peaked."""
    gen = torch.Generator().manual_seed(SEED)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    d = config["head_dim"]
    q_size, kv_size = config["num_attention_heads"] * d, config["num_key_value_heads"] * d

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * INIT_STD).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": normal(q_size, hidden),
            p + "self_attn.k_proj.weight": normal(kv_size, hidden),
            p + "self_attn.v_proj.weight": normal(kv_size, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, q_size),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        }
    weights["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    return weights


def _write(directory: Path) -> None:
    config = tiny_config()
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer = {"encoding": ENCODING, "eos_token": EOS_TOKEN}
    (directory / "tiktoken.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    save_file(tiny_weights(config), str(directory / "model.safetensors"), {"format": "pt"})


def ensure_tiny_model(cache_dir: str | Path | None = None) -> Path:
    """The tiny checkpoint's directory, created on first call. Written into a temporary
    directory then renamed, so readers (other processes included) see all of it or none."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / TINY_DIR_NAME
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{TINY_DIR_NAME}-", dir=target.parent))
    try:
        _write(staging)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # a concurrent writer finishing first is not an error
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
