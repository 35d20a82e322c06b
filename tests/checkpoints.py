"""Tiny seeded random Hugging Face checkpoints for tests (transformers is a test dependency).

API:
- ``make_checkpoint(tmp_dir, family, *, seed=0, max_shard_size=None, round_to=None,
  **overrides) -> Path``
  saves a float32 ``llama`` / ``qwen2`` / ``qwen3`` / ``phi3`` / ``opt`` model (hidden 64,
  2 layers, vocab 256-512, GQA but for opt; qwen3's heads of 32 make its attention wider than
  its hidden size) with config.json + safetensors; ``overrides`` go to the family's
  transformers config class; ``max_shard_size`` (e.g. ``"40KB"``) writes a sharded checkpoint
  with an index file; ``round_to=torch.float16`` draws weights that float16 holds exactly.
- ``checkpoint_fixture(family, **kwargs)`` returns a session-scoped pytest fixture building
  one such checkpoint once per run. Reuse it in any test module or conftest:
  ``llama_checkpoint = checkpoint_fixture("llama")``.
- ``load_hf_model(path)`` loads the transformers model of a checkpoint (float32, eval) as the
  reference to compare against.

Every parameter (norm weights and biases included, which transformers initialises to ones and
zeros) is drawn from the seed, so a test that ignores a weight fails.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

FAMILIES = ("llama", "qwen2", "qwen3", "phi3", "opt")
# Llama 3.1's rope scaling, with an original context short enough that a test's positions
# reach the interpolated frequencies.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# Phi-3.5's LongRoPE for a head of 16: its short factors run up to the original context of 64,
# and the context ratio 4 scales cos and sin.
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.3, 4.0],
            "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]}

_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "qwen2": dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "qwen3": dict(
        vocab_size=352, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "phi3": dict(
        vocab_size=288, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ),
    "opt": dict(
        vocab_size=272, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=64,
        bos_token_id=2, eos_token_id=2, pad_token_id=1,
    ),
}


def _config(family: str, overrides: dict[str, Any]):
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "phi3": transformers.Phi3Config,
        "opt": transformers.OPTConfig,
    }
    if family not in classes:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    return classes[family](**{**_DEFAULTS[family], **overrides})


def _randomize(model: torch.nn.Module, seed: int, round_to: torch.dtype | None) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            # Norm gains around 1; everything else wide enough that attention is not uniform
            # and greedy tokens have clear margins.
            is_gain = "norm" in name and name.endswith("weight")
            value = 1.0 + 0.1 * noise if is_gain else 0.1 * noise
            param.copy_(value if round_to is None else value.to(round_to).float())


def make_checkpoint(
    tmp_dir: str | Path,
    family: str,
    *,
    seed: int = 0,
    max_shard_size: str | None = None,
    round_to: torch.dtype | None = None,
    **overrides: Any,
) -> Path:
    """Writes a random ``family`` checkpoint into ``tmp_dir`` (created if needed); returns it.
    With ``round_to`` (torch.float16 or torch.bfloat16) every weight is a value of that type,
    stored as float32: a converter writing that type then loses nothing."""
    import transformers

    config = _config(family, overrides)
    torch.manual_seed(seed)  # transformers' own init draws from the global generator
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    _randomize(model, seed, round_to)
    path = Path(tmp_dir)
    path.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    if int(transformers.__version__.split(".")[0]) < 5:
        kwargs["safe_serialization"] = True
    model.save_pretrained(path, **kwargs)
    return path


def checkpoint_fixture(family: str, **kwargs: Any) -> Callable[..., Path]:
    """A session-scoped fixture returning the path of ``make_checkpoint(..., family, **kwargs)``."""

    @pytest.fixture(scope="session")
    def _checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return make_checkpoint(tmp_path_factory.mktemp(f"ckpt-{family}"), family, **kwargs)

    return _checkpoint


def load_hf_model(path: str | Path) -> torch.nn.Module:
    """The transformers model of a checkpoint, float32, in eval mode."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()
